"""Backend.run over scripted channel states: when the runtime counts as lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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
        self.taken = asyncio.Event()  # set as the waiter takes a change

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.states[self.index]

    async def wait_for_state_change(self, last: grpc.ChannelConnectivity) -> None:
        await self.advance.wait()
        self.advance.clear()
        self.index += 1
        self.taken.set()

    async def step(self) -> None:
        """Move to the next state, and return once the waiter took the change."""
        self.taken.clear()
        self.advance.set()
        await asyncio.wait_for(self.taken.wait(), 5)

    async def close(self) -> None:
        pass


async def run_through(
    states: list[grpc.ChannelConnectivity],
    socket: Path = Path("/nonexistent.sock"),
    between: Callable[[int], None] = lambda index: None,
    answers: tuple[BackendInfo, ...] = (INFO,),
) -> list[str]:
    """The listener calls while the channel goes through ``states``;
    ``between(i)`` runs just before the channel moves to ``states[i]``; the
    probes answer ``answers`` in turn, then the last one again."""
    backend = Backend(socket, None, [])
    channel = ScriptedChannel(states)
    backend.runtime_channel = backend.image_channel = channel  # type: ignore[assignment]
    events: list[str] = []
    probed = asyncio.Event()

    pending = list(answers)

    async def probe_once() -> BackendInfo:
        return pending.pop(0) if len(pending) > 1 else pending[0]

    backend.probe_once = probe_once  # type: ignore[method-assign]
    backend.on_change(lambda info: (events.append("probed"), probed.set()))
    backend.on_lost(lambda: events.append("lost"))
    reconnected = asyncio.Event()
    backend.on_reconnect(lambda restarted: reconnected.set())
    task = asyncio.create_task(backend.run())
    await asyncio.wait_for(probed.wait(), 5)
    for index in range(1, len(states)):
        between(index)
        reconnected.clear()
        await channel.step()
    await asyncio.sleep(0)
    if states[-1] == S.READY:  # looked at: as the runtime it left, or probed again
        await asyncio.wait_for(reconnected.wait(), 5)
    task.cancel()
    return events


async def test_a_quick_restart_without_a_failure_state_is_a_loss_until_probed() -> None:
    assert await run_through([S.READY, S.IDLE, S.CONNECTING, S.READY]) == ["probed", "lost", "probed"]


async def test_a_reconnect_over_before_the_monitor_looks_is_still_seen() -> None:
    """Woken as the channel left READY, the monitor finds it READY again (a
    call of the proxy's own reconnected it meanwhile): the runtime may be a
    new one, so it is probed again."""
    assert await run_through([S.READY, S.READY]) == ["probed", "lost", "probed"]


async def test_a_failed_connection_is_one_loss() -> None:
    states = [S.READY, S.IDLE, S.TRANSIENT_FAILURE, S.CONNECTING, S.TRANSIENT_FAILURE, S.CONNECTING, S.READY]
    assert await run_through(states) == ["probed", "lost", "probed"]


IDLE_RECONNECT = [S.READY, S.IDLE, S.CONNECTING, S.READY]


async def test_an_idle_channel_reconnecting_to_the_same_runtime_is_no_loss(tmp_path: Path) -> None:
    socket = tmp_path / "runtime.sock"
    socket.touch()
    assert await run_through(IDLE_RECONNECT, socket) == ["probed"]


async def test_a_quick_restart_is_told_from_idle_by_its_new_socket(tmp_path: Path) -> None:
    socket = tmp_path / "runtime.sock"
    socket.touch()

    def restart(index: int) -> None:
        if index == 2:  # while the channel is IDLE: the runtime makes its socket anew
            socket.unlink()
            socket.touch()

    assert await run_through(IDLE_RECONNECT, socket, restart) == ["probed", "lost", "probed"]


async def test_idle_reconnect_with_a_changed_answer_is_a_new_runtime(tmp_path: Path) -> None:
    socket = tmp_path / "runtime.sock"
    socket.touch()
    upgraded = BackendInfo(frozenset({ApiVersion.V1}), "fake", "2")
    events = await run_through(IDLE_RECONNECT, socket, answers=(INFO, upgraded))
    assert events == ["probed", "lost", "probed"]


class LiveChannel:
    """A channel whose state the test sets at any time, as grpc's changes on its own."""

    def __init__(self) -> None:
        self.state = S.READY
        self._changed = asyncio.Condition()
        self._version = 0
        self._notifying: set[asyncio.Future[None]] = set()  # held: the loop keeps only weak references to tasks

    def set(self, state: grpc.ChannelConnectivity) -> None:
        self.state = state
        self._version += 1
        notify = asyncio.ensure_future(self._notify())
        self._notifying.add(notify)
        notify.add_done_callback(self._notifying.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.state

    async def wait_for_state_change(self, last: grpc.ChannelConnectivity) -> None:
        if self.state != last:
            return
        version = self._version
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != version)

    async def close(self) -> None:
        pass


async def test_a_restart_while_a_reconnect_is_being_checked_is_seen() -> None:
    """The runtime restarts again while the proxy probes the first restart:
    the second is probed too (a lone watch of the channel missed it: it was
    READY again once the probe returned)."""
    backend = Backend(Path("/nonexistent.sock"), None, [])
    channel = LiveChannel()
    backend.runtime_channel = backend.image_channel = channel  # type: ignore[assignment]
    probing, go_on = asyncio.Event(), asyncio.Event()
    probes = 0

    async def probe_once() -> BackendInfo:
        nonlocal probes
        probes += 1
        if probes == 2:  # the first restart's probe: the runtime restarts meanwhile
            probing.set()
            await go_on.wait()
        return INFO

    backend.probe_once = probe_once  # type: ignore[method-assign]
    restarts: list[bool] = []
    both = asyncio.Event()

    def reconnected(restarted: bool) -> None:
        restarts.append(restarted)
        if len(restarts) == 2:
            both.set()

    backend.on_reconnect(reconnected)
    task = asyncio.create_task(backend.run())
    try:
        await asyncio.wait_for(backend.ready.wait(), 5)
        channel.set(S.IDLE)
        channel.set(S.READY)
        await asyncio.wait_for(probing.wait(), 5)
        channel.set(S.IDLE)  # and back, before the probe returns
        channel.set(S.READY)
        go_on.set()
        await asyncio.wait_for(both.wait(), 5)
        assert restarts == [True, True] and probes == 3
    finally:
        task.cancel()
