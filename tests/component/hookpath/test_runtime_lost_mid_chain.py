"""A runtime lost while a hooked call's pre hooks run stops the chain: the
later hook servers are not asked, the call is not sent, and the client gets
UNAVAILABLE. On the grpc path the outage gate is asked again before each pre
hook (cripath/unreachable.py, ``runtime_gate``); on the frames path the
runtime connection's close cancels the call's stages (frames/runtimegone.py).

Before (grpc path): the gate was asked once, before the first pre hook: the
second hook server was asked about a call whose runtime was gone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from hooks.sdk import HookServer, write_hook_config
from runtimeproxy.app import RunningProxy

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend
from .crirequests import RUN_POD, sandbox_config

PRE = "PreRunPodSandbox"


async def test_a_runtime_lost_while_a_pre_hook_runs_stops_the_chain(running, fake, client, sock_dir, hook_dir) -> None:
    # "a" is asked first (same priority: by file name); it answers after its delay.
    async with hook_server(sock_dir, "a", {PRE: {"delay": 1.5}}) as first, hook_server(sock_dir, "b", {PRE: {}}) as second:
        first.register(hook_dir, [PRE], timeout="10s")
        second.register(hook_dir, [PRE], timeout="10s")
        await registered(running, 2)
        request = v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString()
        call = asyncio.ensure_future(client.unary_unary(RUN_POD)(request, timeout=20))
        await first.received(PRE)
        await fake.stop()  # containerd killed while the first pre hook works
        with pytest.raises(aio.AioRpcError) as failed:
            await call
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
        assert second.records() == [], failed.value.details()
        assert not fake.calls(RUN_POD)
        details = failed.value.details() or ""
        if running.proxy._data_path == "grpc":  # noqa: SLF001 - which path serves
            assert "no later hook server of its chain was asked" in details, details
        else:  # the runtime's own end of the stream, relayed (a killed containerd: its connection's close)
            assert details in ("Cancelling all calls", "runtime-proxy: the runtime closed the connection"), details


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
    running: RunningProxy, fake: FakeBackend, client: aio.Channel, sock_dir: Path, hook_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that passed the outage gate while the runtime was up, then
    waited for its pod's lock while the runtime died: its first pre hook's
    build finds the gate closed, and the call is refused before any hook, its
    message saying no hook server was asked (``PreHooks.build``'s first
    build, ``between_hooks`` False). On the frames path the runtime
    connection's close ends the waiting call itself.

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
    async with HeldFirst(sock_dir / "held.sock") as server:
        write_hook_config(hook_dir, "held", server.socket_path, [PRE], failure_policy="Fail", timeout="10s")
        await registered(running, 1)
        request = v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString()
        first = asyncio.ensure_future(client.unary_unary(RUN_POD)(request, timeout=20))
        await asyncio.wait_for(server.arrived.wait(), 10)  # the first call holds the pod's lock, in its hook
        second = asyncio.ensure_future(client.unary_unary(RUN_POD)(request, timeout=20))
        await asyncio.wait_for(waiting.wait(), 10)
        await fake.stop()
        channel = running.proxy.backend.runtime_channel
        async with asyncio.timeout(10):  # the proxy has seen the runtime's connection go
            while (state := channel.get_state()) is grpc.ChannelConnectivity.READY:
                await channel.wait_for_state_change(state)
        server.go.set()  # the first call goes on to the runtime (gone), then hands the lock on
        results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 20)
        assert server.asked == 1, results
    assert isinstance(results[1], aio.AioRpcError), results
    refused = results[1]
    assert not fake.calls(RUN_POD)
    details = refused.details() or ""
    if running.proxy._data_path == "grpc":  # noqa: SLF001 - which path serves
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, details
        assert details.endswith("the call was not sent and no hook server was asked"), details
    else:  # the runtime's own end of the stream (its reset, or its connection's close), relayed
        assert refused.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), details
