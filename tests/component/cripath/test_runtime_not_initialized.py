"""A runtime that listens but does not serve yet (containerd's CRI plugin
loading its state answers every call UNKNOWN "server is not initialized yet",
Version and Status too) has its hooked calls refused before their hooks, from
the first answer that says so until it is seen to serve (cripath/unready.py).
Run on both data paths (this directory's conftest).

Before: the outage gate judged grpc's channel alone, READY to such a runtime:
every hooked call asked its hooks, then failed at the runtime."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.cripath import backend as backend_module
from runtimeproxy.cripath.server import Proxy

from ..fakes import FakeBackend
from .test_runtime_outage_gate import PODS, Asked, asked_proxy, outcome

CONTAINERS = "/runtime.v1.RuntimeService/ListContainers"  # no stage: relayed as it is
STATUS = "/runtime.v1.RuntimeService/Status"
VERSION = "/runtime.v1.RuntimeService/Version"
NOT_INITIALISED = {"code": grpc.StatusCode.UNKNOWN, "details": "server is not initialized yet"}
# containerd 2.x's answer (its errgrpc maps errdefs.ErrUnavailable).
NOT_INITIALISED_2 = {"code": grpc.StatusCode.UNAVAILABLE, "details": "server is not initialized yet: unavailable"}
REFUSED = "UNAVAILABLE: runtime-proxy: the runtime at"


@pytest.fixture
async def proxy(fake: FakeBackend, start_proxy) -> Proxy:  # type: ignore[no-untyped-def]
    return await asked_proxy(fake, start_proxy)


async def unary(sock_dir: Path, path: str) -> str:
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
        try:
            await channel.unary_unary(path)(b"", timeout=5)
        except aio.AioRpcError as err:
            return f"{err.code().name}: {err.details()}"
    return "OK"


@pytest.mark.parametrize("answer", [NOT_INITIALISED, NOT_INITIALISED_2], ids=["containerd-1", "containerd-2"])
@pytest.mark.parametrize("learned_from", ["a hooked call", "a call without hooks"])
async def test_hooked_calls_are_refused_before_their_hooks_once_the_runtime_says_it_is_not_initialised(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path, learned_from: str, answer: dict
) -> None:
    """containerd-2 (UNAVAILABLE '...: unavailable') failed before: only UNKNOWN was read as 'not initialized'."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    assert await outcome(sock_dir) == "OK" and stage.asked == 1
    # As a containerd restarted between two calls answers (the channel never saw it go).
    for path in (PODS, CONTAINERS, STATUS):
        fake.script(path, **answer)
    first = await outcome(sock_dir) if learned_from == "a hooked call" else await unary(sock_dir, CONTAINERS)
    assert first == f"{answer['code'].name}: {answer['details']}"
    asked = stage.asked
    refused = [await outcome(sock_dir) for _ in range(3)]
    assert stage.asked == asked, refused
    for text in refused:
        assert text.startswith(REFUSED) and "does not serve calls yet" in text, text
        assert answer["details"] in text and "no hook server was asked" in text, text
    # Initialised: the proxy's own Status says so within its re-check period.
    for path in (PODS, CONTAINERS, STATUS):
        del fake.scripts[path]
    after: list[str] = []
    async with asyncio.timeout(10):
        while not after or after[-1] != "OK":
            after.append(await outcome(sock_dir))
    assert stage.asked == asked + 1, after


async def test_a_restarted_runtime_that_is_not_initialised_yet_has_hooked_calls_refused_before_their_hooks(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path
) -> None:
    """The backend's probe of the new runtime is the first answer: no hooked
    call needs to fail at the runtime first."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    assert await outcome(sock_dir) == "OK" and stage.asked == 1
    await fake.stop()
    fake.received.clear()
    fake.script(STATUS, **NOT_INITIALISED)
    fake.script(PODS, **NOT_INITIALISED)
    await fake.start()
    await fake.wait_calls(STATUS, 1, timeout=15)  # the proxy's probe of the new runtime
    refused = [await outcome(sock_dir) for _ in range(3)]
    assert stage.asked == 1, refused
    assert not fake.calls(PODS), refused
    for text in refused:
        assert "does not serve calls yet" in text and "no hook server was asked" in text, text
    del fake.scripts[STATUS], fake.scripts[PODS]
    async with asyncio.timeout(10):
        while (last := await outcome(sock_dir)) != "OK":
            assert "no hook server was asked" in last, last
    assert stage.asked == 2


async def test_after_a_restart_hooked_calls_wait_for_the_runtimes_first_answer_to_the_proxy(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path
) -> None:
    """Between the new runtime's connection and its answer to the proxy's probe
    it may not serve yet (containerd listens before its CRI plugin has loaded):
    hooked calls are refused then, not sent with their hooks to find out. Here
    the probe's Status is held unanswered for as long as the test needs."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    assert await outcome(sock_dir) == "OK" and stage.asked == 1
    await fake.stop()
    fake.received.clear()
    fake.script(STATUS, hang=True)
    await fake.start()
    await fake.wait_calls(STATUS, 1, timeout=15)  # the channel is up: the probe waits for its answer
    refused = await outcome(sock_dir)
    assert stage.asked == 1 and not fake.calls(PODS), refused
    assert refused.startswith(REFUSED) and "does not serve calls yet" in refused, refused
    fake.scripts[STATUS].release.set()
    async with asyncio.timeout(10):
        while (last := await outcome(sock_dir)) != "OK":
            assert "no hook server was asked" in last, last
    assert stage.asked == 2


@pytest.mark.parametrize("learned_from", ["a hooked call", "a call without hooks"])
async def test_an_ordinary_unknown_leaves_the_gate_open(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path, learned_from: str
) -> None:
    """A guard: only 'not initialized yet' closes the gate, not any UNKNOWN."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    assert await outcome(sock_dir) == "OK" and stage.asked == 1
    path = PODS if learned_from == "a hooked call" else CONTAINERS
    fake.script(path, code=grpc.StatusCode.UNKNOWN, details="failed to pull image: image not found")
    first = await outcome(sock_dir) if learned_from == "a hooked call" else await unary(sock_dir, CONTAINERS)
    assert first == "UNKNOWN: failed to pull image: image not found"
    del fake.scripts[path]
    after = [await outcome(sock_dir) for _ in range(3)]
    assert after == ["OK"] * 3 and proxy.backend.unready.reason is None, after
    assert stage.asked == (5 if learned_from == "a hooked call" else 4)


async def test_a_version_slower_than_the_probe_timeout_after_an_idle_reconnect_refuses_no_hooked_call(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel went idle and reconnected to the runtime it left, whose
    Version is slow (the rest answers): the re-check probe fails by its
    timeout, and is retried, but hooked calls go on meanwhile.

    Before: the failed probe told Unready the runtime was lost, and hooked
    calls were refused until a Status answered."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    assert await outcome(sock_dir) == "OK" and stage.asked == 1
    monkeypatch.setattr(backend_module, "PROBE_TIMEOUT", 0.3)
    fake.script(VERSION, hang=True)
    backend = proxy.backend
    probed = len(fake.calls(VERSION))  # the proxy's start
    reconnect = asyncio.create_task(backend._reconnected())  # as the monitor does when the channel is READY again
    try:
        await fake.wait_calls(VERSION, probed + 2, timeout=10)  # the first probe timed out; it is retried
        assert not reconnect.done() and not backend.connected
        after = [await outcome(sock_dir) for _ in range(3)]
        assert after == ["OK"] * 3 and stage.asked == 4, after
    finally:
        fake.scripts[VERSION].release.set()
        async with asyncio.timeout(10):
            await reconnect
    assert backend.connected
