"""A unary call the proxy refuses (a CRI version it does not serve, a method
the backend's version lacks, a backend it cannot serve, no backend yet) is
answered the refusal's status whatever its request stream holds: with no
message, or two, as with one. A server answers an unknown method before it
reads a message (grpc-go: UNIMPLEMENTED on the header block), so the
message count is never what it answers. On both data paths
(tests/component/grpcpath/)."""

from __future__ import annotations

from typing import Any

import pytest

from ..fakes import FakeBackend, is_probe
from ..rawh2 import DATA, END_STREAM, final_status, frame, message, open_call, without_request

BODIES = {
    "no-message": without_request,
    "one-message": lambda block: block + frame(DATA, END_STREAM, 1, message(b"")),
    "two-messages": lambda block: block + frame(DATA, END_STREAM, 1, message(b"") + message(b"")),
}

# refusal: (backend versions or None for no backend, proxy settings, the call's path, the status)
REFUSALS: dict[str, tuple[frozenset[str] | None, dict[str, Any], str, str]] = {
    "version-not-served": (frozenset({"v1"}), {}, "/runtime.v1alpha2.RuntimeService/ListContainers", "12"),
    "method-not-in-backend-version": (
        frozenset({"v1alpha2"}), {"serve_versions": "v1"}, "/runtime.v1.RuntimeService/ListPodSandboxMetrics", "12"
    ),
    "backend-not-servable": (
        frozenset({"v1alpha2"}), {"backend_version": "v1"}, "/runtime.v1.RuntimeService/ListContainers", "9"
    ),
    "no-backend-yet": (None, {}, "/runtime.v1.RuntimeService/ListContainers", "14"),
}


@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_refused_unary_call_gets_the_refusal_whatever_its_messages(sock_dir, start_proxy, refusal, body) -> None:
    versions, settings, path, status = REFUSALS[refusal]
    async with FakeBackend(sock_dir / "b.sock", versions=versions or frozenset()) as fake:
        if versions is None:
            await fake.stop()  # nothing listens: the proxy keeps probing
            await start_proxy(fake.socket, wait=False, **settings)
        else:
            await start_proxy(fake.socket, **settings)
        assert await final_status(sock_dir / "proxy.sock", BODIES[body](open_call(1, path))) == status
        assert [r.path for r in fake.received if not is_probe(r.path)] == []
