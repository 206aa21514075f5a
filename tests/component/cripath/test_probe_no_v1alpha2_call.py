"""The proxy's own probes of a runtime and of an image service that serve v1
learn whether v1alpha2 is there without a v1alpha2 call of their own
(cripath/registered.py: containerd 1.7 records a deprecation at one), from
grpc-go's answer to a method that does not exist; an answer that does not
tell (grpc-python's) leaves the real call, as before. Against fakes that
answer as grpc-go does (``go_unknown``) or as grpc-python does.

Before: Version and ImageFsInfo were asked in v1alpha2 at every probe.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.cripath import backend as backend_module
from runtimeproxy.cripath.backend import Backend, BackendUnavailable
from runtimeproxy.cripath.imageprobe import Probed, image_probe
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.cripath.registered import NO_SUCH_METHOD
from runtimeproxy.host.unixsocket import grpc_address

from ..fakes import FakeBackend, version_response

V1, A2 = ApiVersion.V1, ApiVersion.V1ALPHA2
BOTH = frozenset({"v1", "v1alpha2"})
A2_VERSION = "/runtime.v1alpha2.RuntimeService/Version"
A2_STATUS = "/runtime.v1alpha2.RuntimeService/Status"
A2_FS_INFO = "/runtime.v1alpha2.ImageService/ImageFsInfo"
A2_RUNTIME_PROBE = f"/runtime.v1alpha2.RuntimeService/{NO_SUCH_METHOD}"
A2_IMAGE_PROBE = f"/runtime.v1alpha2.ImageService/{NO_SUCH_METHOD}"
NOT_INITIALIZED = "server is not initialized yet"


def v1alpha2_calls(fake: FakeBackend) -> list[str]:
    """The v1alpha2 calls that reached the fake's handlers (containerd's CRI code)."""
    return [r.path for r in fake.received if r.path.startswith("/runtime.v1alpha2.")]


# A hung probe's timeout. Its bounds below leave room for a loaded machine's
# event-loop lag and still tell one timeout from two.
HUNG_TIMEOUT = 2.0
ONE_TIMEOUT = 1.75 * HUNG_TIMEOUT


def sent_in_the_second_half(fake: FakeBackend, path: str, started: float, timeout: float) -> None:
    """The one call of ``path`` was sent once the first half of ``timeout``
    (counted from ``started``, taken before the probe) had passed, soon
    after, and given the rest of that one deadline: no more (the second half
    at most) and no less. Read from when the fake had it: a slow loop only
    makes that later, which all but the second bound allow for."""
    [call] = fake.calls(path)
    assert call.time_remaining is not None
    sent = call.at - started
    assert sent >= timeout / 2 - 0.1, f"sent at {sent:.2f}s of {timeout}s"  # the first half was waited
    # Not much later, as the old "given > 0.3 of 1 s" (room for a slow loop: it only makes this later).
    assert sent < 0.7 * timeout, f"sent at {sent:.2f}s of {timeout}s"
    assert call.time_remaining < timeout / 2 + 0.1, call.time_remaining  # the second half at most
    # Its deadline (as the fake saw it) is the probe's: not shortened.
    assert sent + call.time_remaining > timeout - 0.1, (sent, call.time_remaining)


async def probed(fake: FakeBackend) -> frozenset[ApiVersion]:
    backend = Backend(fake.socket, None, options=[])
    try:
        info = await backend.probe_once()
    finally:
        await backend.close()
    return info.versions


@pytest.fixture
async def channel_to(sock_dir: Path) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(grpc_address(sock_dir / "f.sock")) as opened:
        yield opened


@pytest.mark.parametrize(("served", "found"), [
    (BOTH, frozenset(ApiVersion)),  # "unknown method ... for service runtime.v1alpha2.RuntimeService"
    (frozenset({"v1"}), frozenset({V1})),  # "unknown service runtime.v1alpha2.RuntimeService"
])
async def test_a_go_runtime_serving_v1_gets_no_v1alpha2_call(
        sock_dir: Path, served: frozenset[str], found: frozenset[ApiVersion]) -> None:
    """v1 only: the old Version call reached no handler either (grpc-go
    refuses it first): that case guards the reading of "unknown service"."""
    async with FakeBackend(sock_dir / "f.sock", versions=served, go_unknown=True) as fake:
        assert await probed(fake) == found
        assert v1alpha2_calls(fake) == []
        assert fake.calls("/runtime.v1.RuntimeService/Version") and fake.calls("/runtime.v1.RuntimeService/Status")


@pytest.mark.parametrize("details", ["Method not found!", f"unknown method {NO_SUCH_METHOD} for service runtime.v1"])
async def test_an_answer_that_does_not_tell_leaves_the_real_version_call(sock_dir: Path, details: str) -> None:
    """grpc-python's message, or one naming another service: v1alpha2's
    Version is asked as before, and its UNIMPLEMENTED still means not served."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script(A2_RUNTIME_PROBE, code=grpc.StatusCode.UNIMPLEMENTED, details=details)
        assert await probed(fake) == frozenset(ApiVersion)
        assert v1alpha2_calls(fake) == [A2_RUNTIME_PROBE, A2_VERSION]
        fake.script(A2_VERSION, code=grpc.StatusCode.UNIMPLEMENTED, details="not here")
        assert await probed(fake) == frozenset({V1})


async def test_a_grpc_python_runtime_answering_any_method_gets_the_real_call(sock_dir: Path) -> None:
    """The default fake answers the method that does not exist OK: not told."""
    async with FakeBackend(sock_dir / "f.sock") as fake:
        assert await probed(fake) == frozenset(ApiVersion)
        assert v1alpha2_calls(fake) == [A2_RUNTIME_PROBE, A2_VERSION]


async def test_a_v1alpha2_only_runtime_is_still_asked_its_version(sock_dir: Path) -> None:
    """v1 not served: the runtime's name and version come from v1alpha2's
    Version, and its Status is the not-initialised gate, as before. Guards
    existing behaviour."""
    async with FakeBackend(sock_dir / "f.sock", versions=frozenset({"v1alpha2"}), go_unknown=True) as fake:
        fake.script(A2_VERSION, response=version_response("v1alpha2"))
        backend = Backend(fake.socket, None, options=[])
        try:
            info = await backend.probe_once()
        finally:
            await backend.close()
        assert (info.versions, info.runtime_name) == (frozenset({A2}), "fake")
        assert v1alpha2_calls(fake) == [A2_VERSION, A2_STATUS]


@pytest.mark.parametrize(("served", "expected"), [
    (BOTH, Probed(None, frozenset(ApiVersion))),
    (frozenset({"v1"}), Probed(None, frozenset({V1}))),
])
async def test_a_go_image_service_serving_v1_gets_no_v1alpha2_call(
        sock_dir: Path, channel_to: aio.Channel, served: frozenset[str], expected: Probed) -> None:
    """v1 only guards the reading of "unknown service", as for the runtime."""
    async with FakeBackend(sock_dir / "f.sock", versions=served, go_unknown=True) as fake:
        assert await image_probe(channel_to, 5) == expected
        assert v1alpha2_calls(fake) == []
        assert fake.calls("/runtime.v1.ImageService/ImageFsInfo")


@pytest.mark.parametrize("details", ["Method not found!", "unknown service runtime.v1alpha2.RuntimeService"])
async def test_an_image_answer_that_does_not_tell_leaves_the_real_call(
        sock_dir: Path, channel_to: aio.Channel, details: str) -> None:
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script(A2_IMAGE_PROBE, code=grpc.StatusCode.UNIMPLEMENTED, details=details)
        fake.script(A2_FS_INFO, code=grpc.StatusCode.UNIMPLEMENTED,
                    details="unknown service runtime.v1alpha2.ImageService")
        assert await image_probe(channel_to, 5) == Probed(None, frozenset({V1}))
        assert v1alpha2_calls(fake) == [A2_IMAGE_PROBE, A2_FS_INFO]


async def test_a_v1_image_call_not_served_yet_fails_v1alpha2_alike_without_its_call(
        sock_dir: Path, channel_to: aio.Channel) -> None:
    """v1 not initialised, v1alpha2 registered: v1alpha2 is taken to fail
    alike (containerd's two versions share one service), its ImageFsInfo not
    asked; the service is down, as before."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script("/runtime.v1.ImageService/ImageFsInfo", code=grpc.StatusCode.UNKNOWN, details=NOT_INITIALIZED)
        assert await image_probe(channel_to, 5) == Probed(
            f"ImageFsInfo (v1, v1alpha2): UNKNOWN: {NOT_INITIALIZED}")
        assert v1alpha2_calls(fake) == []


async def test_a_v1alpha2_only_image_service_is_still_asked(sock_dir: Path, channel_to: aio.Channel) -> None:
    """v1 lacking: v1alpha2's ImageFsInfo tells whether it serves. Guards existing behaviour."""
    async with FakeBackend(sock_dir / "f.sock", versions=frozenset({"v1alpha2"}), go_unknown=True) as fake:
        assert await image_probe(channel_to, 5) == Probed(None, frozenset({A2}))
        assert v1alpha2_calls(fake) == [A2_FS_INFO]


async def test_a_hung_v1_leaves_v1alpha2_the_rest_of_one_deadline(sock_dir: Path, channel_to: aio.Channel) -> None:
    """v1 hung: v1alpha2's real call is sent after the question's half of
    the probe's timeout and serves; the probe still costs one timeout."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script("/runtime.v1.ImageService/ImageFsInfo", hang=True)
        started = time.monotonic()
        probed = await image_probe(channel_to, HUNG_TIMEOUT)
        assert time.monotonic() - started < ONE_TIMEOUT
        assert probed == Probed(None, frozenset({A2}), failed="ImageFsInfo (v1): DEADLINE_EXCEEDED: Deadline Exceeded",
                                failing=frozenset({V1}))
        sent_in_the_second_half(fake, A2_FS_INFO, started, HUNG_TIMEOUT)


@pytest.mark.parametrize("hung", ["/runtime.v1.ImageService/ImageFsInfo", A2_IMAGE_PROBE])
async def test_both_hung_cost_one_timeout_and_both_are_asked(
        sock_dir: Path, channel_to: aio.Channel, hung: str) -> None:
    """v1 (or the question) and v1alpha2's ImageFsInfo hung: each asked, each
    named, within one timeout."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script(hung, hang=True)
        fake.script(A2_FS_INFO, hang=True)
        started = time.monotonic()
        probed = await image_probe(channel_to, HUNG_TIMEOUT)
        assert time.monotonic() - started < ONE_TIMEOUT
        sent_in_the_second_half(fake, A2_FS_INFO, started, HUNG_TIMEOUT)
        if hung == A2_IMAGE_PROBE:
            assert probed == Probed(None, frozenset({V1}), failed="ImageFsInfo (v1alpha2): DEADLINE_EXCEEDED: "
                                    "Deadline Exceeded", failing=frozenset({A2}))
        else:
            assert probed == Probed("ImageFsInfo (v1, v1alpha2): DEADLINE_EXCEEDED: Deadline Exceeded")


async def test_a_hung_image_question_leaves_the_real_call_the_rest(sock_dir: Path, channel_to: aio.Channel) -> None:
    """The method that does not exist hung: v1alpha2's ImageFsInfo is sent
    in the rest of the timeout, and serves."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script(A2_IMAGE_PROBE, hang=True)
        started = time.monotonic()
        assert await image_probe(channel_to, HUNG_TIMEOUT) == Probed(None, frozenset(ApiVersion))
        assert time.monotonic() - started < ONE_TIMEOUT
        sent_in_the_second_half(fake, A2_FS_INFO, started, HUNG_TIMEOUT)


@pytest.fixture
def hung_probes(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(backend_module, "PROBE_TIMEOUT", HUNG_TIMEOUT)
    return HUNG_TIMEOUT


async def test_a_hung_runtime_question_and_version_cost_one_timeout(sock_dir: Path, hung_probes: float) -> None:
    """v1alpha2's question and its Version both hung: the step fails within
    one PROBE_TIMEOUT, the Version sent in its second half."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script(A2_RUNTIME_PROBE, hang=True)
        fake.script(A2_VERSION, hang=True)
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="DEADLINE_EXCEEDED"):
            await probed(fake)
        assert time.monotonic() - started < ONE_TIMEOUT
        sent_in_the_second_half(fake, A2_VERSION, started, hung_probes)


async def test_a_hung_runtime_question_leaves_the_real_version_call(sock_dir: Path, hung_probes: float) -> None:
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script(A2_RUNTIME_PROBE, hang=True)
        started = time.monotonic()
        assert await probed(fake) == frozenset(ApiVersion)
        sent_in_the_second_half(fake, A2_VERSION, started, hung_probes)


async def test_a_registered_v1alpha2_is_taken_as_served(sock_dir: Path) -> None:
    """A v1alpha2 registered whose Version is not implemented (a stub; no
    known runtime: containerd 1.7's v1alpha2 shares v1's service) is taken
    as served, its Version not asked (before: it was left out, v1alpha2
    clients translated to v1). Pins the documented trade."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script(A2_VERSION, code=grpc.StatusCode.UNIMPLEMENTED, details="method Version not implemented")
        assert await probed(fake) == frozenset(ApiVersion)
        assert v1alpha2_calls(fake) == []


# A slow image service's probe timeout, and its answers' delay: past the
# half, with room for a loaded machine's lag before the deadline.
SLOW_TIMEOUT = 4.0
SLOW_ANSWER = 0.65 * SLOW_TIMEOUT


async def test_a_slow_image_service_is_served_in_both_versions(sock_dir: Path, channel_to: aio.Channel) -> None:
    """Both versions' ImageFsInfo answering after 65% of the probe's
    timeout: v1's answer, past the question's half, still tells v1alpha2 is
    there; the real v1alpha2 call sent meanwhile is dropped (before:
    v1alpha2 was judged on that call alone, given the last half, and named
    failing, DEADLINE_EXCEEDED)."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        for path in ("/runtime.v1.ImageService/ImageFsInfo", A2_FS_INFO):
            fake.script(path, delay=SLOW_ANSWER)
        started = time.monotonic()
        assert await image_probe(channel_to, SLOW_TIMEOUT) == Probed(None, frozenset(ApiVersion))
        # v1's answer, not the real call's deadline (which the real call's answer, due past it, would run to)
        assert SLOW_ANSWER - 0.1 < time.monotonic() - started < SLOW_TIMEOUT - 0.2


async def test_a_slow_v1_still_judges_a_registered_v1alpha2_failing_of_its_own(
        sock_dir: Path, channel_to: aio.Channel) -> None:
    """v1's ImageFsInfo answering after 65% of the timeout, v1alpha2's real call
    (sent at the half) failing UNAVAILABLE at once: v1's answer still says
    v1alpha2 is there, as it does when v1 answers in the first half (before:
    v1alpha2 named failing, its judgement hanging on v1's speed)."""
    async with FakeBackend(sock_dir / "f.sock", go_unknown=True) as fake:
        fake.script("/runtime.v1.ImageService/ImageFsInfo", delay=SLOW_ANSWER)
        fake.script(A2_FS_INFO, code=grpc.StatusCode.UNAVAILABLE, details="v1alpha2 gone")
        assert await image_probe(channel_to, SLOW_TIMEOUT) == Probed(None, frozenset(ApiVersion))
        assert v1alpha2_calls(fake) == [A2_FS_INFO]  # sent at the half, as documented
