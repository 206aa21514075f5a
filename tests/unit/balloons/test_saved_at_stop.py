"""The saved reserved set at the hook's stop (hooks/balloons/savedset.py
SavedSet.finish, HookServer._before_release): the last set is on disk
before the hook socket's lock goes, a slow write in its thread is handed
back still running and keeps the lock until it lands (the stop ends), and
nothing is written once it has. Machines as in test_hotplug: CPUs 0-3 on
NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

from hooks.balloons import savedio, savedset
from hooks.balloons.config import parse_config
from hooks.balloons.runtime import RuntimeClient
from hooks.balloons.savedreserved import ReservedFile, SavedReserved
from hooks.balloons.savedset import SavedSet
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology
from hooks.errors import HookServerError
from runtimeproxy.host import socketlock

from .test_hotplug import hook_on_sysfs
from .test_saved_reserved import ALONE, saved_in

WAIT = 10.0  # seconds a test thread waits for the test at most: a failure, not a hang


async def test_the_last_set_is_on_disk_before_the_socket_lock_is_released(tmp_path: Path, monkeypatch) -> None:
    """``hook run`` cancels the background work (the writer) after the
    stop, which lets the lock go at its end: a second instance waiting on
    it started, read the file and removed the first's temporary file while
    that one's last write was still to come (before: the set the rebuild
    noted was not on disk when the lock went)."""
    state = tmp_path / "state"
    hook, _, _ = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(state)})  # its rebuild noted reserved 1
    at_release: list[object] = []
    real_release = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        if lock is not None and lock.path == socketlock.lock_path(Path(hook.socket_path)):  # not the status socket's
            at_release.append(saved_in(state)["reserved_cpus"] if (state / "reserved.json").exists() else None)
        real_release(lock)

    monkeypatch.setattr(socketlock, "release", release)
    await hook.start()
    await hook.stop()
    assert at_release == ["0"]


async def test_a_slow_write_is_handed_back_running_and_a_set_still_waiting_is_dropped(
    tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past its wait the stop drops the set still waiting, and hands back the
    write already in its thread (which cannot be stopped), for the lock to
    wait on: it must not land after the next instance read or wrote the
    file. Nothing is written after (before: finish() waited for it to its
    end, so a stalled disk held the stop for good)."""
    config = parse_config({**ALONE, "stateDir": str(tmp_path)})
    started, gave_up = threading.Event(), threading.Event()
    landed: list[frozenset[int]] = []
    real = ReservedFile.save

    def slow(self: ReservedFile, saved: SavedReserved) -> None:
        started.set()
        assert gave_up.wait(WAIT)  # until finish() has given up on its wait
        real(self, saved)
        landed.append(saved.cpus)

    class GaveUp(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("stopping before the reserved CPUs and the balloons were saved"):
                gave_up.set()

    monkeypatch.setattr(ReservedFile, "save", slow)
    logging.getLogger("hooks.balloons").addHandler(handler := GaveUp())
    try:
        saved = SavedSet(str(tmp_path))
        saved.record(config, frozenset({1}))
        writer = asyncio.create_task(saved.run())
        assert await asyncio.to_thread(started.wait, WAIT)
        saved.record(config, frozenset({2}))  # waits for the write of {1}
        in_flight = await saved.finish(timeout=0.05)
    finally:
        logging.getLogger("hooks.balloons").removeHandler(handler)
    assert in_flight is not None  # finish() did not wait for it: no await since its thread was let go
    await asyncio.wait_for(asyncio.shield(in_flight), WAIT)
    assert landed == [frozenset({1})]  # {2}: dropped
    assert saved_in(tmp_path)["reserved_cpus"] == "1"
    await asyncio.wait_for(writer, WAIT)  # the writer ends with finish()
    saved.record(config, frozenset({3}))
    await saved.write_due()
    assert landed == [frozenset({1})]


@pytest.mark.parametrize("bound", ["STOP_WRITE_WAIT", "release_step_timeout"])
async def test_a_write_stuck_in_its_thread_ends_the_stop_and_keeps_the_lock_until_it_lands(
    tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture, bound: str
) -> None:
    """A stalled disk: the stop ends past STOP_WRITE_WAIT, the socket's lock
    is not let go while the write may still land (the next instance would
    read the old set, or have its own overwritten), and goes once it has,
    the new set on disk (before: the stop waited for the write for good).
    Cut first by a ``release_step_timeout`` below STOP_WRITE_WAIT (2 s), the
    step never returned the write: the lock went at the cut, the write
    still to land (before the write was handed over as it started)."""
    if bound == "STOP_WRITE_WAIT":
        monkeypatch.setattr(savedset, "STOP_WRITE_WAIT", 0.05)
    state = tmp_path / "state"
    hook, _, _ = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(state)})  # its rebuild noted reserved 1
    if bound == "release_step_timeout":
        hook.release_step_timeout = 0.05
    disk = threading.Event()
    real_save = ReservedFile.save

    def stalled(self: ReservedFile, saved: SavedReserved) -> None:
        assert disk.wait(WAIT)
        real_save(self, saved)

    released = asyncio.Event()
    at_release: list[object] = []
    real_release = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        if lock is not None and lock.path == socketlock.lock_path(Path(hook.socket_path)):
            at_release.append(saved_in(state)["reserved_cpus"] if (state / "reserved.json").exists() else None)
            released.set()
        real_release(lock)

    monkeypatch.setattr(ReservedFile, "save", stalled)
    monkeypatch.setattr(socketlock, "release", release)
    await hook.start()
    try:
        with caplog.at_level(logging.INFO):
            await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
            assert at_release == [] and not hook.serving  # stopped, the lock kept
            assert "BalloonsHook stopped, but keeps its socket's lock until disk I/O it cannot cut" in caplog.text
            disk.set()
            await asyncio.wait_for(released.wait(), WAIT)
    finally:
        disk.set()
    assert at_release == ["0"]  # the write landed before the lock went


async def test_a_stuck_write_keeps_the_lock_when_asyncio_run_cancels_the_tasks_left(
    tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After ``main`` returns, asyncio.run cancels every task left; the write
    handed back was a Task wrapping the thread's, cancelled so while the
    thread still wrote (before: the lock went at once, logged as "last write
    has ended", and the write landed after it)."""
    monkeypatch.setattr(savedset, "STOP_WRITE_WAIT", 0.05)
    state = tmp_path / "state"
    hook, _, _ = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(state)})
    disk, landed = threading.Event(), threading.Event()
    real_save = ReservedFile.save

    def stalled(self: ReservedFile, saved: SavedReserved) -> None:
        assert disk.wait(WAIT)
        real_save(self, saved)
        landed.set()

    released = asyncio.Event()
    landed_at_release: list[bool] = []
    real_release = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        if lock is not None and lock.path == socketlock.lock_path(Path(hook.socket_path)):
            landed_at_release.append(landed.is_set())
            released.set()
        real_release(lock)

    monkeypatch.setattr(ReservedFile, "save", stalled)
    monkeypatch.setattr(socketlock, "release", release)
    await hook.start()
    try:
        with caplog.at_level(logging.INFO):
            await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
            left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in left:  # as asyncio.run does once main has returned
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            assert landed_at_release == []
            assert "last write has ended" not in caplog.text
            disk.set()
            await asyncio.wait_for(released.wait(), WAIT)
    finally:
        disk.set()
    assert landed_at_release == [True]


async def test_a_write_that_fails_after_the_stop_removes_no_file(tmp_path: Path, monkeypatch) -> None:
    """The writer's write fails once finish() has given up on it: the file
    is left (before: the failure path removed it, after the lock went)."""
    config = parse_config({**ALONE, "stateDir": str(tmp_path)})
    started, fail = threading.Event(), threading.Event()
    removed: list[Path] = []

    def failing(self: ReservedFile, saved: SavedReserved) -> None:
        started.set()
        assert fail.wait(WAIT)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ReservedFile, "save", failing)
    monkeypatch.setattr(ReservedFile, "remove", lambda self: removed.append(self.path))
    saved = SavedSet(str(tmp_path))
    saved.record(config, frozenset({1}))
    writer = asyncio.create_task(saved.run())
    assert await asyncio.to_thread(started.wait, WAIT)
    in_flight = await saved.finish(timeout=0.05)
    assert in_flight is not None
    fail.set()
    await asyncio.wait_for(writer, WAIT)
    assert removed == []


async def test_a_set_due_in_a_new_state_dir_is_not_written_after_the_stop_gave_up_on_leaving_the_old(
    tmp_path: Path, monkeypatch
) -> None:
    """A reload moved stateDir: the writer removes the old files, then writes
    the new. finish() gives up while the removal is stuck in its thread, and
    hands that one back; the writer went on to write the new directory's
    files once it ended, after the lock went (before: the failure path
    checked the stop, this one did not)."""
    old, new = tmp_path / "old", tmp_path / "new"
    config = parse_config({**ALONE, "stateDir": str(new)})
    started, disk = threading.Event(), threading.Event()
    real_remove = savedio.remove

    def stalled(*args: object) -> None:
        started.set()
        assert disk.wait(WAIT)
        real_remove(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(savedio, "remove", stalled)
    saved = SavedSet(str(old))
    saved.record(config, frozenset({1}))
    writer = asyncio.create_task(saved.run())
    assert await asyncio.to_thread(started.wait, WAIT)
    in_flight = await saved.finish(timeout=0.05)
    assert in_flight is not None  # the removal: the lock waits for it
    disk.set()
    await asyncio.wait_for(asyncio.shield(in_flight), WAIT)
    await asyncio.wait_for(writer, WAIT)
    assert not new.exists() or not list(new.iterdir())


async def test_a_stopped_balloons_hook_cannot_be_started_again(tmp_path: Path) -> None:
    """Its stop closed its runtime client for good (before: it started,
    serving with a client every listing and move of which failed)."""
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(tmp_path / "runtime.sock")))
    await hook.start()
    await hook.stop(0, drain=0)
    with pytest.raises(HookServerError, match="used once"):
        await hook.start()
    assert not hook.serving


async def test_a_start_failed_on_its_status_socket_stops_the_hook_and_can_start_again(tmp_path: Path) -> None:
    """Its stop wrote its last set and ended its writer (before that: the
    failed start stopped the server alone); the file gone, a start again
    reopens them under the lock and starts (before this: refused as "used
    once"); that it serves: test_start_again.py."""
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(tmp_path / "runtime.sock")))
    hook.status_socket.write_text("not a socket")  # the status server refuses a non-socket file
    with pytest.raises(Exception, match="is not a unix socket"):
        await hook.start()
    assert not hook.serving and hook._runtime.closed
    hook.status_socket.unlink()
    await hook.start()
    try:
        assert hook.serving and hook.status_socket.is_socket() and not hook._runtime.closed
    finally:
        await hook.stop(0, drain=0)


async def test_a_stop_given_a_drain_stops_the_status_socket_and_closes_the_runtime_client(tmp_path: Path) -> None:
    """Guards existing behaviour: stop(grace, drain=) runs the SDK's stop
    with balloons' steps, the status socket gone and the runtime client
    closed (once a TypeError: the override took no ``drain``)."""
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(tmp_path / "runtime.sock")))
    await hook.start()
    assert hook.status_socket.exists()
    await hook.stop(0.5, drain=0.25)
    assert not hook.serving
    assert not hook.status_socket.exists()
    assert hook._runtime.closed


async def test_a_stop_during_the_status_sockets_start_leaves_no_status_socket(tmp_path: Path, monkeypatch) -> None:
    """A stop while the status server waits on its socket's lock: the
    start raises, and no status socket serves after the stop (before: the
    stop found no status server to stop, the status start then bound its
    socket and kept its lock, and start returned on a stopped hook)."""
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(tmp_path / "runtime.sock")))
    real_claim = socketlock.claim
    at_status_claim, go_on = asyncio.Event(), asyncio.Event()

    async def claim(path: Path, *args: object, **kwargs: object) -> socketlock.SocketLock:
        if Path(path) == hook.status_socket:
            at_status_claim.set()
            await go_on.wait()
        return await real_claim(path, *args, **kwargs)

    monkeypatch.setattr(socketlock, "claim", claim)
    starting = asyncio.ensure_future(hook.start())
    await asyncio.wait_for(at_status_claim.wait(), WAIT)
    await hook.stop(0, drain=0)
    go_on.set()
    with pytest.raises(HookServerError, match="cancelled by a stop"):
        await asyncio.wait_for(starting, WAIT)
    assert not hook.serving
    assert not hook.status_socket.exists()
    monkeypatch.setattr(socketlock, "claim", real_claim)
    lock = await asyncio.wait_for(real_claim(hook.status_socket), WAIT)  # its lock let go: claimed at once
    socketlock.release(lock)


async def test_a_stop_given_a_negative_drain_stops_nothing(tmp_path: Path) -> None:
    """The ValueError comes before the stop touches anything (before: the
    override stopped the status server and closed the runtime client as
    HookServer.stop raised, and the hook served on with a closed client)."""
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(tmp_path / "runtime.sock")))
    await hook.start()
    try:
        with pytest.raises(ValueError, match="drain must be 0 or more"):
            await hook.stop(drain=-1)
        assert hook.serving and not hook._runtime.closed
        _, writer = await asyncio.open_unix_connection(str(hook.status_socket))  # still answering
        writer.close()
        await writer.wait_closed()
    finally:
        await hook.stop(0, drain=0)
    assert hook._runtime.closed and not hook.status_socket.exists()



class Executor:
    """The loop's run_in_executor, with futures the test ends: the first
    write's stays pending until ``first`` is ended, each later one ends at
    once (recorded in ``started``: a write started)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.started, self.first = loop, [], loop.create_future()
        self.first_started = asyncio.Event()

    def run_in_executor(self, _executor: object, call: object, *args: object) -> asyncio.Future[object]:
        self.started.append(call)
        if len(self.started) == 1:
            self.first_started.set()
            return self.first
        done = self.loop.create_future()
        done.set_result(None)
        return done


async def test_no_write_starts_once_finish_gave_up_on_a_stuck_one(tmp_path: Path, monkeypatch) -> None:
    """finish()'s own write is stuck; it gives up past its wait, which frees
    the writer waiting for the lock before finish() is done (wait_for ends
    its inner task first). Before: that writer went on to write once the
    stuck write ended, after finish() had returned it as the last one."""
    config = parse_config({**ALONE, "stateDir": str(tmp_path)})
    loop = asyncio.get_running_loop()
    executor = Executor(loop)
    monkeypatch.setattr(loop, "run_in_executor", executor.run_in_executor)
    saved = SavedSet(str(tmp_path))
    saved.record(config, frozenset({1}))
    finishing = asyncio.create_task(saved.finish(timeout=0.05))
    await asyncio.wait_for(executor.first_started.wait(), WAIT)  # finish()'s write of {1} is in its thread
    writer = asyncio.create_task(saved.run())
    saved.record(config, frozenset({2}))  # the writer waits for the lock finish() holds
    in_flight = await asyncio.wait_for(finishing, WAIT)
    assert in_flight is executor.first
    executor.first.set_result(None)  # the stuck write lands
    await asyncio.wait_for(writer, WAIT)
    assert len(executor.started) == 1  # before: 2, the set {2} written after finish() returned


async def test_no_write_starts_once_the_release_step_was_cut(tmp_path: Path, monkeypatch) -> None:
    """The writer's write ends a loop step before the release step's bound
    cuts finish(), which read what was handed over at the cut (that write,
    done: the lock goes). Before: the writer, woken after the cut, started
    the next write, handed over to no one, landing after the lock went."""
    config = parse_config({**ALONE, "stateDir": str(tmp_path)})
    loop = asyncio.get_running_loop()
    executor = Executor(loop)
    monkeypatch.setattr(loop, "run_in_executor", executor.run_in_executor)
    saved = SavedSet(str(tmp_path))
    saved.record(config, frozenset({1}))
    writer = asyncio.create_task(saved.run())
    await asyncio.wait_for(executor.first_started.wait(), WAIT)  # the writer's write of {1} is in its thread
    saved.record(config, frozenset({2}))
    handed: list[asyncio.Future[object]] = []
    step = asyncio.create_task(saved.finish(hand_over=handed.append))
    await asyncio.sleep(0)  # finish() hands the writer's write over, and waits for the lock
    assert handed == [executor.first]
    executor.first.set_result(None)  # its thread ends ...
    step.cancel()  # ... and the bound cuts the step before the writer wakes (run_bounded reads handed() now)
    assert all(write.done() for write in handed)  # the lock goes
    await asyncio.wait_for(asyncio.gather(step, return_exceptions=True), WAIT)
    await asyncio.wait_for(writer, WAIT)
    assert len(executor.started) == 1  # before: 2, the set {2} written after the lock went


async def test_the_background_writers_stuck_write_keeps_the_lock_when_the_step_is_cut(
    tmp_path: Path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The background writer's write is stuck in its thread as the stop
    begins; finish() waits for the writer's lock, and a ``release_step_timeout``
    below STOP_WRITE_WAIT cuts it there: that write must keep the lock all
    the same (finish() hands it over as it begins: before it did, the lock
    went at the cut, the write still to land)."""
    state = tmp_path / "state"
    hook, _, _ = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(state)})  # its rebuild noted reserved 1
    hook.release_step_timeout = 0.05
    started, disk = threading.Event(), threading.Event()
    real_save = ReservedFile.save

    def stalled(self: ReservedFile, saved: SavedReserved) -> None:
        started.set()
        assert disk.wait(WAIT)
        real_save(self, saved)

    released = asyncio.Event()
    at_release: list[object] = []
    real_release = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        if lock is not None and lock.path == socketlock.lock_path(Path(hook.socket_path)):
            at_release.append(saved_in(state)["reserved_cpus"] if (state / "reserved.json").exists() else None)
            released.set()
        real_release(lock)

    monkeypatch.setattr(ReservedFile, "save", stalled)
    monkeypatch.setattr(socketlock, "release", release)
    await hook.start()
    writer = asyncio.create_task(hook._saved.run())  # as hook run's background work
    try:
        assert await asyncio.to_thread(started.wait, WAIT)
        with caplog.at_level(logging.INFO):
            await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
            assert at_release == []  # before: [None], the lock gone at the cut
            assert "last step before releasing its socket's lock was cut" in caplog.text
            disk.set()
            await asyncio.wait_for(released.wait(), WAIT)
    finally:
        disk.set()
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    assert at_release == ["0"]


async def test_the_runtime_client_is_closed_before_the_release_steps_write(tmp_path: Path, monkeypatch) -> None:
    """A move waiting when the socket's lock goes could be applied after the
    next instance listed the cpusets: the client closes (no move sent any
    more) as the release step begins (before: only in _after_stop, once
    the lock had gone)."""
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(tmp_path / "runtime.sock")))
    closed_at_finish: list[bool] = []
    real_finish = hook._saved.finish

    async def finish(**kwargs: object) -> object:
        closed_at_finish.append(hook._runtime.closed)
        with pytest.raises(Exception, match="closed"):  # a move the background task would send now: refused, unsent
            await hook._runtime.update_cpuset("c1", "0", "")
        return await real_finish(**kwargs)

    monkeypatch.setattr(hook._saved, "finish", finish)
    await hook.start()
    await hook.stop(0, drain=0)
    assert closed_at_finish == [True]
