"""A translated unary call with no request message, or two, on the frames
path: answered INTERNAL at once (as the hooked path and grpc-go answer it),
not left hanging as grpc.aio's server leaves it, nor passed on in part."""

from __future__ import annotations

import pytest

from ..fakes import FakeBackend
from ..rawh2 import DATA, END_STREAM, final_status, frame, message, open_call, without_request

V1 = "/runtime.v1.RuntimeService/ListContainers"
A2 = "/runtime.v1alpha2.RuntimeService/ListContainers"


CASES = {
    "no-message": without_request,
    "two-messages": lambda block: block + frame(DATA, END_STREAM, 1, message(b"") + message(b"")),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_translated_unary_call_without_its_one_message_is_answered_internal(sock_dir, start_proxy, case) -> None:
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1alpha2"})) as fake:
        fake.script(A2, response=b"")
        await start_proxy(fake.socket, data_path="frames", serve_versions="v1,v1alpha2")
        assert await final_status(sock_dir / "proxy.sock", CASES[case](open_call(1, V1)), timeout=10) == "13"  # INTERNAL
        assert fake.calls(A2) == []
