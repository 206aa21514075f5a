"""batchresource's stop saves the containers recorded since the last pass
while it still holds the hook socket's lock, and writes nothing after
(BatchResourceHook._before_release): the next instance, waiting on the lock,
reads every answer, and no late write lands on its files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from hooks.batchresource import server
from hooks.batchresource.state import StateDir

from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, container_request, pod_request
from .learnfixtures import KUBELET_V1, TWO, hook_with_learner, kubelet_be_cgroups, values
from .specs import BE
from .stalleddisk import containers_at_release

STATE = Path("state") / "uid-1.json"
WAIT = 10.0  # at most, for what must happen: a failure, not a hang
STALL = 3.0  # a stalled save gives up past this: the loop it blocked lets the test fail, not hang


async def test_the_answers_since_the_last_pass_are_saved_before_the_lock_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: saved after HookServer.stop had let the lock go, so a new
    instance could read the file without the last answers (then overwrite
    those containers, logged as untold)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path)
    await hook.start()
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=2))
    at_release, _ = containers_at_release(monkeypatch, tmp_path / STATE)
    await hook.stop(0, drain=0)
    assert at_release == [[["main", 2]]]
    assert json.loads((tmp_path / STATE).read_text())["swap"] == {"main": 0}  # kubelet's ask (none) kept too


async def test_a_pass_under_way_as_the_hook_stops_writes_no_file_nor_cgroup(tmp_path: Path) -> None:
    """The listing's loop runs until ``hook run`` cancels it, after the stop:
    a pass that was awaiting the runtime then takes nothing up (before: it
    saved the pod's file after the lock went, over the next instance's, and
    later still wrote the pod's and its containers' cgroups, the next
    instance's to write by then)."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, f"{POD_PARENT}/c-main")
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"})
    hook, stub = hook_with_learner(tmp_path, pod)
    await hook.start()

    async def the_hook_stops() -> None:
        await hook.stop(0, drain=0)

    stub.during["PodSandboxStatus"] = the_hook_stops
    assert hook.learner is not None
    assert await hook.learner.pass_once() == []
    assert not (tmp_path / STATE).exists()
    assert values(root, 1, POD_PARENT) == values(root, 1, f"{POD_PARENT}/c-main") == KUBELET_V1


async def test_the_last_saves_on_a_stalled_disk_keep_the_lock_not_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last saves (an fsync each) run in a thread: past STOP_SAVE_WAIT
    the stop ends and the lock is kept until they land (before: they ran on
    the loop, so a stalled disk blocked it, the step's bound never fired,
    and the stop hung with it)."""
    monkeypatch.setattr(server, "STOP_SAVE_WAIT", 0.05, raising=False)  # (raising: the test fails on its outcome without it)
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path)
    await hook.start()
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=2))
    disk, stalled_out = threading.Event(), threading.Event()
    real_save = StateDir.save

    def stalled(self: StateDir, *args: Any, **kwargs: Any) -> None:
        if not disk.wait(STALL):
            stalled_out.set()  # the loop never let the disk go: it was blocked
        real_save(self, *args, **kwargs)

    monkeypatch.setattr(StateDir, "save", stalled)
    landed_at_release, released = containers_at_release(monkeypatch, tmp_path / STATE)
    try:
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
        assert landed_at_release == []  # stopped, the lock kept
        disk.set()
        await asyncio.wait_for(released.wait(), WAIT)
    finally:
        disk.set()
    assert not stalled_out.is_set()
    assert landed_at_release == [[["main", 2]]]


async def test_pods_are_closed_even_when_the_listing_s_close_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing's close that hangs is cut by the release step's bound: the
    pods are closed all the same, so the reconcile loop writes or removes
    no file after the lock went (before: close() came after it, never ran,
    and a pod forgotten later had its file removed from under the next
    instance)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path)
    hook.release_step_timeout = 0.1
    await hook.start()
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    assert (tmp_path / STATE).exists()
    assert hook.learner is not None
    lister, closes = hook.learner.lister, 0
    real_close = lister.close

    async def hangs_once() -> None:
        nonlocal closes
        closes += 1
        if closes == 1:
            await asyncio.Event().wait()
        await real_close()

    monkeypatch.setattr(lister, "close", hangs_once)
    await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
    hook.pods.forget("uid-1", "PostStopPodSandbox")
    assert (tmp_path / STATE).exists()


@pytest.mark.parametrize("cut_by", ["release_step_timeout", "a cancelled stop"])
async def test_the_last_saves_keep_the_lock_when_the_step_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut_by: str
) -> None:
    """The saves' thread starts before the listing's close and is handed to
    the SDK at once: a step cut while that close hangs (its bound, or the
    stop cancelled) still keeps the lock until the stalled saves land
    (before: the thread started only after the close, or was handed back
    only by the step's return, so the lock went while it wrote)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path)
    hook.release_step_timeout = 0.3 if cut_by == "release_step_timeout" else 30.0
    await hook.start()
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=2))
    assert hook.learner is not None
    lister, closing = hook.learner.lister, asyncio.Event()
    real_close = lister.close

    async def hangs_once() -> None:
        if not closing.is_set():
            closing.set()
            await asyncio.Event().wait()
        await real_close()

    disk, saving = threading.Event(), threading.Event()
    real_save = StateDir.save

    def stalled(self: StateDir, *args: Any, **kwargs: Any) -> None:
        saving.set()
        disk.wait(STALL)
        real_save(self, *args, **kwargs)

    monkeypatch.setattr(lister, "close", hangs_once)
    monkeypatch.setattr(StateDir, "save", stalled)
    landed_at_release, released = containers_at_release(monkeypatch, tmp_path / STATE)
    try:
        stopping = asyncio.ensure_future(hook.stop(0, drain=0))
        if cut_by == "a cancelled stop":
            await asyncio.wait_for(closing.wait(), WAIT)
            stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(stopping, WAIT)
        assert await asyncio.to_thread(saving.wait, WAIT)  # the saves under way, stalled
        assert landed_at_release == []  # stopped, the lock kept
        disk.set()
        await asyncio.wait_for(released.wait(), WAIT)
    finally:
        disk.set()
    assert landed_at_release == [[["main", 2]]]


async def test_a_stop_given_a_negative_drain_closes_nothing(tmp_path: Path) -> None:
    """The ValueError comes before the stop touches anything (before: the
    override closed the runtime listing's channel as HookServer.stop raised,
    and the hook served on with a lister that could never list again)."""
    hook, _ = hook_with_learner(tmp_path)
    assert hook.learner is not None
    await hook.start()
    try:
        with pytest.raises(ValueError, match="drain must be 0 or more"):
            await hook.stop(drain=-1)
        assert hook.serving and not hook.learner.lister.closed
    finally:
        await hook.stop(0, drain=0)
    assert hook.learner.lister.closed
