"""batchresource's last saves stalled at a stop or a failed start (hooks.batchresource.writer):
the socket's lock is kept until they land, then goes, and the hook starts again."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hooks.batchresource import server
from hooks.batchresource.pods import KnownPods
from hooks.batchresource.state import PodRecord, SavedPod, StateDir
from hooks.errors import HookServerError
from runtimeproxy.host import socketlock
from tests.unixsockets import socket_mode_fails

from .fakecgroup import make_cgroup
from .hookfixtures import POD_PARENT, make_hook, pod_request
from .learnfixtures import TWO
from .specs import BE
from .stalleddisk import StalledDisk

OTHER = "/kubepods/besteffort/poduid-2"
WAIT = 10.0  # at most, for what must happen: a failure, not a hang
KEPT = "keeps its socket's lock until a write of its last release step"


def test_a_stop_whose_last_saves_outlive_asyncio_run_lets_the_lock_go_as_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A save stalled, a pod stopped (its removal queued behind it), then
    the hook's stop, past STOP_SAVE_WAIT: the lock kept. The disk frees only
    as asyncio.run ends (its main coroutine returned): asyncio.run waits for
    the writes, its loop running, so the lock goes and the pod's
    "forgotten" line is logged, and the hook started again under a new
    asyncio.run serves, reading the landed file. Before: the last saves'
    future was the writer's own executor's, which asyncio never completes
    once its loop closed, so the lock was never let go in this process (a
    start again refused for good) and the line never logged."""
    monkeypatch.setattr(server, "STOP_SAVE_WAIT", 0.05)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    make_cgroup(tmp_path / "cgroup", 1, OTHER)
    hook = make_hook(tmp_path)
    lock = socketlock.lock_path(Path(hook.socket_path))
    stalled = StalledDisk(monkeypatch, lambda record, _: record.uid == "uid-2")
    real_shutdown = asyncio.BaseEventLoop.shutdown_default_executor

    async def shutdown_default_executor(loop: asyncio.BaseEventLoop, *args: Any) -> None:
        stalled.free()  # as asyncio.run ends: its main coroutine returned, its tasks cancelled
        await real_shutdown(loop, *args)

    monkeypatch.setattr(asyncio.BaseEventLoop, "shutdown_default_executor", shutdown_default_executor)
    caplog.set_level(logging.INFO)

    async def first() -> None:
        await hook.start()
        await hook.pre_run_pod_sandbox(pod_request(BE, TWO))  # known and saved
        call = asyncio.ensure_future(hook.pre_run_pod_sandbox(pod_request(BE, TWO, OTHER, uid="uid-2")))
        with ThreadPoolExecutor(1) as waiting:  # (not the default executor: its join is the one under test)
            assert await asyncio.get_running_loop().run_in_executor(waiting, stalled.writing.wait, WAIT)
        await hook.post_stop_pod_sandbox(pod_request(BE, TWO))  # uid-1's removal, behind the stalled save
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
        assert lock.exists() and not stalled.landed.is_set()  # stopped, the lock kept
        call.cancel()  # (its deadline: its save is left to land)

    loaded: list[list[str]] = []
    real_load = StateDir.load

    def load(state: StateDir) -> dict[str, SavedPod]:
        pods = real_load(state)
        loaded.append(sorted(pods))
        return pods

    async def again() -> None:
        monkeypatch.setattr(StateDir, "load", load)
        await asyncio.wait_for(hook.start(), WAIT)
        try:
            assert hook.serving
            assert loaded == [["uid-2"]]
        finally:
            await hook.stop(0, drain=0)

    try:
        asyncio.run(first())
    finally:
        stalled.free()
    assert not stalled.stalled_out.is_set()  # (freed as asyncio.run ended, not past the stall's bound)
    assert not lock.exists()
    messages = [r.getMessage() for r in caplog.records]
    assert "BatchResourceHook's last write has ended: its socket's lock goes" in messages
    forgotten = [r for r in caplog.records if r.getMessage() == "batchresource pod forgotten"]
    assert [(r.uid, r.state_file) for r in forgotten] == [("uid-1", "removed")]  # type: ignore[attr-defined]
    assert not (tmp_path / "state" / "uid-1.json").exists()
    asyncio.run(again())


async def test_a_failed_start_whose_last_saves_stall_refuses_a_start_until_they_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails once it holds the lock while a pod is dirty in
    memory (a swap ask told, not saved yet): its release step's last save
    stalls, past STOP_SAVE_WAIT, so the lock is kept and a start again is
    refused; once it lands, a start serves and reads it. Guards existing
    behaviour."""
    monkeypatch.setattr(server, "STOP_SAVE_WAIT", 0.05)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    hook = make_hook(tmp_path)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))  # known and saved, no swap ask in its file
    assert hook.pods.note_swap("uid-1", "main", 0) is None  # a first ask: dirty, not saved
    stalled = StalledDisk(monkeypatch, lambda _record, _containers: True)
    loaded: list[dict[str, dict[str, int]]] = []
    real_load = StateDir.load

    def load(state: StateDir) -> dict[str, SavedPod]:
        pods = real_load(state)
        loaded.append({key: dict(pod.swap) for key, pod in pods.items()})
        return pods

    monkeypatch.setattr(StateDir, "load", load)
    try:
        with monkeypatch.context() as failing:
            socket_mode_fails(failing, hook.socket_path)
            with pytest.raises(HookServerError, match="cannot set the mode"):
                await asyncio.wait_for(hook.start(), WAIT)
        assert stalled.writing.is_set() and not stalled.landed.is_set()
        with pytest.raises(HookServerError, match=KEPT):
            await hook.start()
        stalled.free()
        await asyncio.wait_for(hook.pods.settled(), WAIT)
    finally:
        stalled.free()
    assert not stalled.stalled_out.is_set()
    await asyncio.wait_for(hook.start(), WAIT)
    try:
        assert hook.serving
        assert loaded[-1] == {"uid-1": {"main": 0}}  # the landed save, read under the lock
        assert json.loads((tmp_path / "state" / "uid-1.json").read_text())["uid"] == "uid-1"
    finally:
        await hook.stop(0, drain=0)


def test_a_save_a_closed_loop_left_is_not_handed_to_a_call_after_a_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's save asked under an asyncio.run that ended before it landed
    (no stop joined the writer): the next start's load forgets it, so the
    pod told again as it is hands no write to wait for (before: the closed
    loop's future, never done, which the call then awaited: a RuntimeError,
    the future attached to another loop)."""
    pods = KnownPods(make_hook(tmp_path).config)
    record = PodRecord("uid-1", "team-a", "batch-job", POD_PARENT, "{}")
    stalled = StalledDisk(monkeypatch, lambda _record, _containers: True)

    async def first() -> None:
        assert pods.remember(record) is not None
        with ThreadPoolExecutor(1) as waiting:
            assert await asyncio.get_running_loop().run_in_executor(waiting, stalled.writing.wait, WAIT)

    async def again() -> None:
        await pods.load()
        assert pods.remember(record) is None  # known as it is, and saved

    try:
        asyncio.run(first())
    finally:
        stalled.free()
    assert stalled.landed.wait(WAIT)
    asyncio.run(again())
