"""Backend.run over scripted channel states: when the runtime counts as lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from runtimeproxy.cripath.backend import Backend, BackendInfo
from runtimeproxy.cripath.methods import ApiVersion

S = grpc.ChannelConnectivity
INFO = BackendInfo(frozenset({ApiVersion.V1}), "fake", "1")


class ScriptedChannel:
    """Goes through ``states`` one change at a time, each when the test says so."""

    def __init__(self, states: list[grpc.ChannelConnectivity]) -> None:
        self.states = states
        self.index = 0
        self.advance = asyncio.Event()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.states[self.index]

    async def wait_for_state_change(self, last: grpc.ChannelConnectivity) -> None:
        await self.advance.wait()
        self.advance.clear()
        self.index += 1

    async def close(self) -> None:
        pass


async def run_through(states: list[grpc.ChannelConnectivity]) -> list[str]:
    backend = Backend(Path("/nonexistent.sock"), None, [])
    channel = ScriptedChannel(states)
    backend.runtime_channel = backend.image_channel = channel  # type: ignore[assignment]
    events: list[str] = []
    probed = asyncio.Event()

    async def probe_once() -> BackendInfo:
        return INFO

    backend.probe_once = probe_once  # type: ignore[method-assign]
    backend.on_change(lambda info: (events.append("probed"), probed.set()))
    backend.on_lost(lambda: events.append("lost"))
    task = asyncio.create_task(backend.run())
    await asyncio.wait_for(probed.wait(), 5)
    for _ in states[1:]:
        probed.clear()
        channel.advance.set()
        while channel.advance.is_set():  # the change was taken
            await asyncio.sleep(0)
    await asyncio.sleep(0)
    if states[-1] == S.READY:
        await asyncio.wait_for(probed.wait(), 5)
    task.cancel()
    return events


async def test_a_quick_restart_without_a_failure_state_is_a_loss_until_probed() -> None:
    assert await run_through([S.READY, S.IDLE, S.CONNECTING, S.READY]) == ["probed", "lost", "probed"]


async def test_a_failed_connection_is_one_loss() -> None:
    states = [S.READY, S.IDLE, S.TRANSIENT_FAILURE, S.CONNECTING, S.TRANSIENT_FAILURE, S.CONNECTING, S.READY]
    assert await run_through(states) == ["probed", "lost", "probed"]
