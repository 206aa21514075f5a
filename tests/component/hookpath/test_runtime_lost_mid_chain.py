"""A runtime lost while a hooked call's pre hooks run stops the chain: the
later hook servers are not asked, the call is not sent, and the client gets
UNAVAILABLE. The runtime is killed as SIGKILL would (tests/component/
severable.py): its connections closed with no GOAWAY, its socket gone.

- grpc path: the outage gate is asked again before each pre hook
  (cripath/unreachable.py, ``runtime_gate``), and the refusal says so;
- frames path: the runtime connection's close (frames/runtimegone.py
  ``closed``, then ``FrameConnection.lost``) cancels the call's stages and
  closes the client's connection (``Stream removed (Socket closed)`` for a
  grpc-python client). Checked by mutation: ``closed`` doing nothing, or
  ``lost`` not cancelling the hooked calls, each fails the first test (the
  chain goes on to the second hook server, or the call never ends).

Each test awaits the proxy's own end of its calls (the hooked-call metric's
count, after the pod's lock is let go) before it says no hook was asked.

Before (grpc path): the gate was asked once, before the first pre hook: the
second hook server was asked about a call whose runtime was gone. Before
(this test): the runtime was stopped by grpc's ``server.stop(0)``, whose
GOAWAY took the frames path through ``runtimegone.going_away`` instead, so
it passed with ``closed`` or ``lost`` broken."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from hooks.sdk import HookServer, write_hook_config
from runtimeproxy.app import RunningProxy, build_proxy

from runtimeproxy.config import ProxyConfig

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend
from ..severable import Severable
from .crirequests import RUN_POD, sandbox_config

PRE = "PreRunPodSandbox"


@pytest.fixture
async def runtime(fake: FakeBackend, sock_dir: Path) -> AsyncIterator[Severable]:
    """The fake runtime behind a socket that can be cut as a SIGKILL would:
    no GOAWAY (the fake's own stop, grpc's, sends one first)."""
    async with Severable(sock_dir / "runtime.sock", fake.socket) as severable:
        yield severable


@pytest.fixture
async def running(fake: FakeBackend, runtime: Severable, sock_dir: Path, hook_dir: Path) -> AsyncIterator[RunningProxy]:
    """The whole proxy in front of ``runtime``."""
    fake.script(RUN_POD, response=v1.RunPodSandboxResponse(pod_sandbox_id="pod-1").SerializeToString())
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=runtime.socket, hook_dir=hook_dir)
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        yield running


def hooked_ends(running: RunningProxy, monkeypatch: pytest.MonkeyPatch) -> asyncio.Queue[tuple[str, str]]:
    """The proxy's own end of each hooked call, (method, outcome), as
    ``runtime_proxy_hooked_calls_total`` counts it: after the call let its
    pod's lock go, whatever its client saw."""
    ends: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    count = running.metrics.hooked_call

    def counted(method: str, outcome: str, seconds: float) -> None:
        count(method, outcome, seconds)
        ends.put_nowait((method, outcome))

    monkeypatch.setattr(running.metrics, "hooked_call", counted)
    return ends


def frames_path(running: RunningProxy) -> bool:
    return running.proxy._data_path == "frames"  # noqa: SLF001 - which path serves


# What the client's grpc (grpc-python) says of a connection closed under its call.
SOCKET_CLOSED = "Stream removed (Socket closed)"
NOT_REACHABLE = "runtime-proxy: the runtime at {} is not reachable (its connection failed; the proxy reconnects by itself)"


async def test_a_runtime_lost_while_a_pre_hook_runs_stops_the_chain(
    running: RunningProxy, fake: FakeBackend, runtime: Severable, client: aio.Channel, sock_dir: Path, hook_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ends = hooked_ends(running, monkeypatch)
    # "a" is asked first (same priority: by file name); it answers after its delay.
    async with hook_server(sock_dir, "a", {PRE: {"delay": 1.5}}) as first, hook_server(sock_dir, "b", {PRE: {}}) as second:
        first.register(hook_dir, [PRE], timeout="10s")
        second.register(hook_dir, [PRE], timeout="10s")
        await registered(running, 2)
        request = v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString()
        call = asyncio.ensure_future(client.unary_unary(RUN_POD)(request, timeout=20))
        await first.received(PRE)
        await runtime.sever()  # containerd killed (no GOAWAY) while the first pre hook works
        with pytest.raises(aio.AioRpcError) as failed:
            await call
        # The proxy's end of the call, which on the frames path comes after the
        # client's (its connection closed at once): by then a chain that went
        # on would have asked "b", 1.5 s after "a".
        assert await asyncio.wait_for(ends.get(), 10) == ("RunPodSandbox", "error")
        assert second.records() == [], failed.value.details()
    assert not fake.calls(RUN_POD)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
    if frames_path(running):
        assert failed.value.details() == SOCKET_CLOSED
    else:
        assert failed.value.details() == (
            NOT_REACHABLE.format(runtime.socket) + "; the call was not sent and no later hook server of its chain was asked")


class HeldFirst(HookServer):
    """A PreRunPodSandbox hook server in the test's process: it answers the
    first call once ``go`` is set, every later one at once."""

    def __init__(self, socket: Path) -> None:
        super().__init__(socket, grace=0)
        self.asked = 0
        self.arrived = asyncio.Event()
        self.go = asyncio.Event()

    async def pre_run_pod_sandbox(self, request: hookapi.PodSandboxHookRequest) -> None:
        self.asked += 1
        self.arrived.set()
        if self.asked == 1:
            await self.go.wait()


async def test_a_runtime_lost_before_the_first_pre_hook_refuses_the_call_before_any_hook(
    running: RunningProxy, fake: FakeBackend, runtime: Severable, client: aio.Channel, sock_dir: Path,
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that passed the outage gate while the runtime was up, then
    waited for its pod's lock while the runtime died: its first pre hook's
    build finds the gate closed, and the call is refused before any hook, its
    message saying no hook server was asked (``PreHooks.build``'s first
    build, ``between_hooks`` False). On the frames path the runtime
    connection's close cancels the waiting call (``FrameConnection.lost``)
    and the held one, whose client sees its connection closed; neither asks
    the hook again.

    Before (not broken at this commit; checked by mutation): a first build
    that skipped the gate asked the hook about a call whose runtime was gone,
    and one that said ``between_hooks`` always told the client a hook server
    had been asked."""
    waiting = asyncio.Event()
    locks = running.hooks.locks
    acquire = locks.acquire

    async def acquire_told(key: str) -> Callable[[], None]:
        waiting.set()  # the call passed the router's gate and waits for the pod's lock
        return await acquire(key)

    monkeypatch.setattr(locks, "acquire", acquire_told)
    ends = hooked_ends(running, monkeypatch)
    async with HeldFirst(sock_dir / "held.sock") as server:
        write_hook_config(hook_dir, "held", server.socket_path, [PRE], failure_policy="Fail", timeout="10s")
        await registered(running, 1)
        request = v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString()
        first = asyncio.ensure_future(client.unary_unary(RUN_POD)(request, timeout=20))
        await asyncio.wait_for(server.arrived.wait(), 10)  # the first call holds the pod's lock, in its hook
        second = asyncio.ensure_future(client.unary_unary(RUN_POD)(request, timeout=20))
        await asyncio.wait_for(waiting.wait(), 10)
        await runtime.sever()
        channel = running.proxy.backend.runtime_channel
        async with asyncio.timeout(10):  # the proxy has seen the runtime's connection go
            while (state := channel.get_state()) is grpc.ChannelConnectivity.READY:
                await channel.wait_for_state_change(state)
        server.go.set()  # the first call goes on to the runtime (gone), then hands the lock on
        results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 20)
        # Both calls' ends on the proxy's side (the frames path's come after
        # their client's): the second would have asked the hook by then.
        outcomes = [await asyncio.wait_for(ends.get(), 10) for _ in range(2)]
        assert outcomes == [("RunPodSandbox", "error")] * 2, results
        assert server.asked == 1, results
    assert not fake.calls(RUN_POD)
    assert [type(r) for r in results] == [aio.AioRpcError] * 2, results
    refused = results[1]
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
    if frames_path(running):
        assert refused.details() == SOCKET_CLOSED
    else:
        assert refused.details() == (
            NOT_REACHABLE.format(runtime.socket) + "; the call was not sent and no hook server was asked")
