"""batchresource writes its state files off the event loop (hooks.batchresource.writer),
one write at a time in the order asked: a stalled disk holds no hook call
that saves nothing, and a pod's writes land in the order they were asked."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hooks.batchresource import server
from hooks.batchresource.pods import KnownPods
from hooks.batchresource.state import PodRecord, StateDir
from hooks.errors import HookServerError
from runtimeproxy.hookpath.points import HookType
from tests.unixsockets import socket_mode_fails

from .fakecgroup import make_cgroup
from .hookfixtures import POD_PARENT, container_request, make_hook, pod_request
from .learnfixtures import TWO, hook_with_learner, kubelet_be_cgroups
from .specs import BE
from .stalleddisk import OTHER, WAIT, StalledDisk, containers_at_release, uid_2_first_save_stalled, writer_threads

STATE = Path("state") / "uid-1.json"


async def test_a_save_on_a_stalled_disk_leaves_the_loop_to_other_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's first call waits for its file, the loop does not: a call for
    another pod, which saves nothing, is answered meanwhile (before: the
    fsync ran on the loop, so a stalled disk held every hook call and
    pass). A second call for the stalled pod waits for its file too."""
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    make_cgroup(root, 1, OTHER)
    hook = make_hook(tmp_path)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO, OTHER, uid="uid-2"))  # known and saved
    stalled = StalledDisk(monkeypatch, lambda record, _: record.uid == "uid-1")
    first = asyncio.ensure_future(hook.pre_run_pod_sandbox(pod_request(BE, TWO)))
    try:
        assert await asyncio.to_thread(stalled.writing.wait, WAIT)  # its save under way, stalled
        second = asyncio.ensure_future(hook.pre_create_container(container_request(BE, TWO, "main")))
        other = container_request(BE, TWO, "main", cgroup_parent=OTHER)
        other.pod_meta.uid = "uid-2"
        answer = await asyncio.wait_for(hook.pre_create_container(other), WAIT)
        assert answer is not None and answer.container_resources.cpu_shares == 512
        assert not first.done() and not second.done()  # their answers wait for the pod's file
        stalled.free()
        assert (await asyncio.wait_for(first, WAIT)) is not None
        assert (await asyncio.wait_for(second, WAIT)) is not None
    finally:
        stalled.free()
    assert not stalled.stalled_out.is_set()
    assert json.loads((tmp_path / STATE).read_text())["uid"] == "uid-1"


def _record(spec: str) -> PodRecord:
    return PodRecord("uid-1", "team-a", "batch-job", POD_PARENT, spec)


@pytest.mark.parametrize(("steps", "final"), [
    (["a", "b"], "b"),  # saved again
    (["a", "forget"], None),  # its removal lands after its save
    (["a", "forget", "b"], "b"),  # told again: its new save after the removal
])
async def test_a_pods_writes_land_in_the_order_they_were_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: list[str], final: str | None
) -> None:
    """Asked back to back, the first one stalled: each later one starts
    only once it has landed, in the order asked, in the one thread, so the
    file ends as the last one asked left it (a write per call in a thread
    of its own would land the later ones first, then the older copy over
    them, or bring back a removed file). The old code, on the loop, kept
    this order too: this guards it."""
    pods = KnownPods(make_hook(tmp_path).config)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    stalled = StalledDisk(monkeypatch, lambda record, _: record.spec == "a")
    try:
        for step in steps:
            if step == "forget":
                pods.forget("uid-1", "PostStopPodSandbox")
            else:
                pods.remember(_record(step))
        assert await asyncio.to_thread(stalled.writing.wait, WAIT)
        stalled.free()
        await asyncio.wait_for(pods.settled(), WAIT)
    finally:
        stalled.free()
    assert not stalled.stalled_out.is_set()
    assert [write for write, _, _ in stalled.started] == [{"forget": "remove"}.get(step, step) for step in steps]
    assert len({thread for _, thread, _ in stalled.started}) == 1
    assert [after for _, _, after in stalled.started] == [False] + [True] * (len(steps) - 1)
    path = tmp_path / STATE
    assert (json.loads(path.read_text())["spec"] if path.exists() else None) == final


async def test_the_last_saves_land_after_a_save_under_way_as_the_hook_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass's save stalled as the hook stops: the stop's last saves, of
    newer containers, land after it, and the lock is kept until they have
    (a last save in a thread of its own could land first, then the older
    copy over it, after the next instance read it)."""
    monkeypatch.setattr(server, "STOP_SAVE_WAIT", 0.05)
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path)
    await hook.start()
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=2))
    stalled = StalledDisk(monkeypatch, lambda _, containers: containers == {("main", 2)})
    landed_at_release, released = containers_at_release(monkeypatch, tmp_path / STATE)
    try:
        hook.pods.flush()  # a pass's save of attempt 2, stalled
        assert await asyncio.to_thread(stalled.writing.wait, WAIT)
        await hook.pre_create_container(container_request(BE, TWO, "main", attempt=3))
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
        assert landed_at_release == []  # stopped, the lock kept
        stalled.free()
        await asyncio.wait_for(released.wait(), WAIT)
    finally:
        stalled.free()
    assert not stalled.stalled_out.is_set()
    assert landed_at_release == [[["main", 3]]]
    assert json.loads((tmp_path / STATE).read_text())["containers"] == [["main", 3]]  # nothing landed after


async def test_a_pod_stop_answers_without_waiting_for_its_files_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostStopPodSandbox forgets the pod and answers, its file's removal
    queued behind a stalled save (before: it waited for the removal, a plain
    unlink no more durable for it, so behind the stalled save for nothing);
    the removal lands after."""
    async with uid_2_first_save_stalled(tmp_path, monkeypatch) as (hook, stalled, first):
        assert await asyncio.to_thread(stalled.writing.wait, WAIT)
        assert await asyncio.wait_for(hook.post_stop_pod_sandbox(pod_request(BE, TWO)), WAIT) is None
        assert not stalled.landed.is_set() and not first.done()  # answered while the disk stalls
        assert "uid-1" not in hook.pods
    assert first.result() is not None
    assert not stalled.stalled_out.is_set()
    assert not (tmp_path / STATE).exists()


FORGOTTEN = "batchresource pod forgotten"
REMOVAL_FAILED = "batchresource could not remove a pod from its state directory"


def _logged(caplog: pytest.LogCaptureFixture) -> list[tuple[str, object]]:
    """The writer's removal lines so far: (message, the forgotten line's state_file)."""
    return [(r.getMessage(), getattr(r, "state_file", None)) for r in caplog.records
            if r.getMessage() in (FORGOTTEN, REMOVAL_FAILED)]


@pytest.mark.parametrize(("fails", "lines"), [
    (False, [(FORGOTTEN, "removed")]),
    (True, [(REMOVAL_FAILED, None), (FORGOTTEN, "not removed")]),  # the failure first, apart
])
async def test_a_forgotten_pods_line_is_logged_once_its_files_removal_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    fails: bool, lines: list[tuple[str, object]],
) -> None:
    """PostStopPodSandbox behind a stalled save: no "forgotten" line while
    its file's removal waits, which a reader would take as the file gone;
    the line once it has ended, its state_file saying how, after the
    failure's warning when it failed. Guards the ordering (a line logged at
    once fails it); state_file is new (before: the line said nothing of
    the file)."""
    caplog.set_level(logging.INFO, "hooks.batchresource")
    async with uid_2_first_save_stalled(tmp_path, monkeypatch, removal_fails=fails) as (hook, stalled, first):
        assert await asyncio.to_thread(stalled.writing.wait, WAIT)
        await hook.post_stop_pod_sandbox(pod_request(BE, TWO))
        assert _logged(caplog) == []
    assert first.result() is not None
    assert not stalled.stalled_out.is_set()
    assert _logged(caplog) == lines
    assert (tmp_path / STATE).exists() == fails


async def test_a_call_cut_while_its_save_waits_leaves_the_save_to_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's first call cut by its deadline while its save is queued
    behind a stalled one: the save is not cancelled, it lands in its turn,
    the pod tracked (a write cancelled with the call would leave a pod the
    hook answered for, in part, with no file). Guards existing behaviour."""
    async with uid_2_first_save_stalled(tmp_path, monkeypatch, uid_1_saved=False) as (hook, stalled, first):
        assert await asyncio.to_thread(stalled.writing.wait, WAIT)
        with pytest.raises(TimeoutError):  # (the disk stalls until freed past the body: the cut is certain)
            await asyncio.wait_for(hook.pre_run_pod_sandbox(pod_request(BE, TWO)), 0.05)
        assert "uid-1" in hook.pods and not (tmp_path / STATE).exists()
    assert first.result() is not None
    assert not stalled.stalled_out.is_set()
    assert json.loads((tmp_path / STATE).read_text())["uid"] == "uid-1"


async def test_a_save_that_raises_a_bug_is_logged_once_and_the_call_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write raising what no save returns (a bug, not an OSError): logged
    once, the pod answered and tracked, as its cgroup was written, and the
    writer goes on with the next write (before: the exception was raised
    into the call too, so the hook answered nothing and logged "the pod is
    left unchanged", false, and the exception twice)."""
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    make_cgroup(tmp_path / "cgroup", 1, OTHER)
    hook = make_hook(tmp_path)
    real = StateDir.save

    def save(state: StateDir, record: PodRecord, *args: Any, **kwargs: Any) -> None:
        if record.uid == "uid-1":
            raise RuntimeError("a bug")
        real(state, record, *args, **kwargs)

    monkeypatch.setattr(StateDir, "save", save)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    answer = await hook.handle(HookType.PRE_RUN_POD_SANDBOX, pod_request(BE, TWO))
    assert answer is not None and "uid-1" in hook.pods
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["batchresource state file save failed"]
    assert await hook.handle(HookType.PRE_RUN_POD_SANDBOX, pod_request(BE, TWO, OTHER, uid="uid-2")) is not None
    assert json.loads((tmp_path / "state" / "uid-2.json").read_text())["uid"] == "uid-2"


def test_a_hook_started_again_under_a_new_event_loop_settles(tmp_path: Path) -> None:
    """Stopped, then started again under another asyncio.run (the first
    loop closed): waiting for its writes, nothing asked since the start,
    returns (before: it waited on the last write of the closed loop, and
    raised RuntimeError until its first new write)."""
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    hook = make_hook(tmp_path)

    async def first() -> None:
        await hook.start()
        try:
            assert await hook.pre_run_pod_sandbox(pod_request(BE, TWO)) is not None
        finally:
            await hook.stop(0, drain=0)

    async def again() -> None:
        await hook.start()
        try:
            await asyncio.wait_for(hook.pods.settled(), WAIT)
            assert "uid-1" in hook.pods
        finally:
            await hook.stop(0, drain=0)

    asyncio.run(first())
    asyncio.run(again())


async def test_last_saves_with_nothing_to_save_start_no_thread(tmp_path: Path) -> None:
    """Nothing dirty and no write under way (a failed start, a stop with
    nothing new): the last saves are done at once (before: a thread was
    started to save nothing)."""
    pods = KnownPods(make_hook(tmp_path).config)
    before = writer_threads()
    pods.close()
    assert pods.last_saves().done()
    assert writer_threads() == before


async def test_the_writers_thread_ends_with_the_stop_and_a_start_after_a_failed_one_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that failed once it held the lock (its release step ran the
    last saves), then a start: the pod's file is saved, by a thread the
    stop ends. Guards existing behaviour."""
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    hook = make_hook(tmp_path)
    before = writer_threads()
    with monkeypatch.context() as failing:
        socket_mode_fails(failing, hook.socket_path)
        with pytest.raises(HookServerError, match="cannot set the mode"):
            await hook.start()
    await hook.start()
    try:
        assert await hook.pre_run_pod_sandbox(pod_request(BE, TWO)) is not None
        assert json.loads((tmp_path / STATE).read_text())["uid"] == "uid-1"
        started = writer_threads() - before
        assert len(started) == 1
    finally:
        await hook.stop(0, drain=0)
    [thread] = started
    await asyncio.to_thread(thread.join, WAIT)
    assert not thread.is_alive()
