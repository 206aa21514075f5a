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

from runtimeproxy.cripath.server import Proxy

from ..fakes import FakeBackend
from .test_runtime_outage_gate import PODS, Asked, outcome

CONTAINERS = "/runtime.v1.RuntimeService/ListContainers"  # no stage: relayed as it is
STATUS = "/runtime.v1.RuntimeService/Status"
NOT_INITIALISED = {"code": grpc.StatusCode.UNKNOWN, "details": "server is not initialized yet"}
REFUSED = "UNAVAILABLE: runtime-proxy: the runtime at"


@pytest.fixture
async def proxy(fake: FakeBackend, start_proxy) -> Proxy:  # type: ignore[no-untyped-def]
    stage = Asked()
    started: Proxy = await start_proxy(fake.socket, stages=(stage,))
    started.asked = stage  # type: ignore[attr-defined]
    return started


async def unary(sock_dir: Path, path: str) -> str:
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
        try:
            await channel.unary_unary(path)(b"", timeout=5)
        except aio.AioRpcError as err:
            return f"{err.code().name}: {err.details()}"
    return "OK"


@pytest.mark.parametrize("learned_from", ["a hooked call", "a call without hooks"])
async def test_hooked_calls_are_refused_before_their_hooks_once_the_runtime_says_it_is_not_initialised(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path, learned_from: str
) -> None:
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    assert await outcome(sock_dir) == "OK" and stage.asked == 1
    # As a containerd restarted between two calls answers (the channel never saw it go).
    for path in (PODS, CONTAINERS, STATUS):
        fake.script(path, **NOT_INITIALISED)
    first = await outcome(sock_dir) if learned_from == "a hooked call" else await unary(sock_dir, CONTAINERS)
    assert first == "UNKNOWN: server is not initialized yet"
    asked = stage.asked
    refused = [await outcome(sock_dir) for _ in range(3)]
    assert stage.asked == asked, refused
    for text in refused:
        assert text.startswith(REFUSED) and "does not serve calls yet" in text, text
        assert "server is not initialized yet" in text and "no hook server was asked" in text, text
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
