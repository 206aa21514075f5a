"""The runtime listing and the containers of pods the hook already knows: one
made while the hook was down gets its values once; one the hook set is left
to other writers; removed ones leave the state file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hooks.batchresource.learn import ADOPTED, UNTOLD
from hooks.batchresource.state import StateDir

from .fakecgroup import write
from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, container_request, make_hook, pod_request, restarted_hook
from .learnfixtures import KUBELET_V1, MIB, TWO, hook_with_learner, kubelet_be_cgroups, values
from .specs import BE

MAIN, SIDE = f"{POD_PARENT}/c-main", f"{POD_PARENT}/c-side"
STATE = Path("state") / "uid-1.json"


def saved_containers(tmp_path: Path) -> list[list[object]] | None:
    return json.loads((tmp_path / STATE).read_text()).get("containers")


async def test_a_container_made_while_the_hook_was_down_gets_its_values_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, MAIN, SIDE)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main", "c-side": "side"}, attempts={"c-side": 3})
    hook, _stub = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main"))  # main through the hook, side not
    # Recorded in memory as the hook answers; its file is written by the pass, not before the answer.
    assert saved_containers(tmp_path) == [] and hook.pods.containers("uid-1") == {("main", 0)}
    write(root, 1, MAIN, "cpu.shares", "700")  # main as the runtime applied it, then another writer changed it
    write(root, 1, POD_PARENT, "cpu.shares", "2")  # (the pod raised first, as the hooks do)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert hook.learner is not None
    for _ in range(2):
        assert await hook.learner.pass_once() == []
    assert values(root, 1, SIDE) == ("256", "25000", str(64 * MIB))
    assert values(root, 1, MAIN)[0] == "700"  # set by the hook: left alone
    [told] = [r for r in caplog.records if r.getMessage() == UNTOLD]
    assert (told.levelno, told.pod, told.container, told.container_id, told.attempt) == (
        logging.INFO, "team-a/batch-job", "side", "c-side", 3)
    writes = [(r.getMessage().split()[3], r.field) for r in caplog.records if r.getMessage().endswith("cgroup value")]
    assert writes[0] == ("pod", "cpu_shares") and ("container", "cpu_shares") in writes
    assert sorted(saved_containers(tmp_path)) == [["main", 0], ["side", 3]]
    # A restarted hook reads them back: nothing written again.
    again = await restarted_hook(tmp_path)
    assert again.pods.containers("uid-1") == frozenset({("main", 0), ("side", 3)})


async def test_a_container_made_again_leaves_the_state_and_one_not_listed_yet_stays(tmp_path: Path) -> None:
    """Only a higher attempt listed drops a recorded container: one not listed
    (removed for good, or answered and not created yet) stays."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, MAIN)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"})
    hook, stub = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main"))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=1))  # main made again
    pod.attempts["c-main"] = 1

    async def kubelet_creates_side() -> None:  # answered after the runtime listed its containers: not made yet
        await hook.pre_create_container(container_request(BE, TWO, "side"))

    stub.during["ListContainers"] = kubelet_creates_side
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert saved_containers(tmp_path) == [["main", 1], ["side", 0]]  # main's attempt 0 dropped, side kept
    pod.containers.clear()  # main removed, not made again: kept until its pod goes
    await hook.learner.pass_once()
    assert saved_containers(tmp_path) == [["main", 1], ["side", 0]]


async def test_a_container_recorded_before_the_pass_and_not_listed_yet_is_left_to_other_writers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hook answered side's PreCreateContainer before the pass began, the
    runtime lists it only after (CreateContainer not done): it is not dropped,
    so the next pass leaves another writer's value (before: dropped, then
    overwritten and logged as untold)."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, TWO)
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "side"))
    assert hook.learner is not None
    await hook.learner.pass_once()  # side not listed yet
    kubelet_be_cgroups(root, 1, SIDE)
    pod.containers["c-side"] = "side"  # created with the hook's answer, then another writer's value
    write(root, 1, SIDE, "cpu.shares", "900")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    await hook.learner.pass_once()
    assert values(root, 1, SIDE)[0] == "900" and saved_containers(tmp_path) == [["side", 0]]
    assert not [r for r in caplog.records if r.getMessage() == UNTOLD]


async def test_the_lists_changed_by_a_pass_are_saved_once_per_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Side written, an answer recorded for main's next attempt: one save of
    the pod's file, its rename not fsync-ed (before: one fsync-ed save per
    container). Main's listed attempt, below the answered one, is ending: not
    written, not recorded (before: written and recorded beside attempt 2)."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, MAIN, SIDE)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main", "c-side": "side"}, attempts={"c-main": 1, "c-side": 1})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=2))
    saves: list[tuple[list[object], bool]] = []
    real = StateDir.save

    def counted(self: StateDir, record: object, containers: object = None, *, sync_dir: bool = True, **kw: Any) -> None:
        saves.append((sorted(containers or ()), sync_dir))
        real(self, record, containers, sync_dir=sync_dir, **kw)

    monkeypatch.setattr(StateDir, "save", counted)
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert saves == [([("main", 2), ("side", 1)], False)]
    assert values(root, 1, MAIN) == KUBELET_V1


async def test_a_container_the_spec_does_not_name_is_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The hook refuses it (not recorded); the listing leaves it too, with no
    warning and no pod cgroup write each pass (before: taken as untold,
    warned of, the pod raised and lowered for it)."""
    root = tmp_path / "cgroup"
    extra = f"{POD_PARENT}/c-extra"
    kubelet_be_cgroups(root, 1, POD_PARENT, extra)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-extra": "extra"})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    assert await hook.pre_create_container(container_request(BE, TWO, "extra")) is None
    write(root, 1, POD_PARENT, "cpu.shares", "2")  # (as if another writer lowered it: the reconcile loop's, not the listing's)
    caplog.clear()
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert values(root, 1, extra) == KUBELET_V1 and saved_containers(tmp_path) == []


async def test_without_a_runtime_endpoint_no_container_is_recorded(tmp_path: Path) -> None:
    """Nothing reads the list without the listing: the hook answers without recording."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook = make_hook(tmp_path)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main"))
    assert hook.pods.containers("uid-1") is None  # unknown, not empty: a listing enabled later adopts


async def test_a_state_file_from_an_older_version_takes_the_running_containers_as_the_hooks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its containers are not known: those running at the first pass are taken
    as set by the hook (left alone); one made after is written."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, MAIN, SIDE)
    (tmp_path / "state").mkdir()
    (tmp_path / STATE).write_text(json.dumps({"uid": "uid-1", "namespace": "team-a", "name": "batch-job",
                                              "cgroup_parent": POD_PARENT, "spec": TWO["node.koordinator.sh/extended-resource-spec"]}))
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pods.load()
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert values(root, 1, MAIN) == KUBELET_V1 and saved_containers(tmp_path) == [["main", 0]]
    assert [r.containers for r in caplog.records if r.getMessage() == ADOPTED] == [1]
    pod.containers["c-side"] = "side"
    await hook.learner.pass_once()
    assert values(root, 1, SIDE) == ("256", "25000", str(64 * MIB)) and values(root, 1, MAIN) == KUBELET_V1


async def test_a_known_pod_stopped_while_its_containers_are_listed_gets_no_write(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, SIDE)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-side": "side"})
    hook, stub = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))

    async def kubelet_stops_it() -> None:
        await hook.post_stop_pod_sandbox(pod_request(BE, TWO))

    stub.during["ListContainers"] = kubelet_stops_it
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert values(root, 1, SIDE) == KUBELET_V1 and not (tmp_path / STATE).exists()


async def test_a_container_gone_before_its_write_is_not_recorded(tmp_path: Path) -> None:
    """Listed, its cgroup gone by the write (removed meanwhile): nothing
    recorded. Guards existing behaviour (it passed before the drop rule changed)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-side": "side"})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert saved_containers(tmp_path) == []


async def test_a_list_a_pass_failed_to_save_is_saved_by_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk at one pass's flush: the pod stays marked, so the next
    pass saves it (before: its list waited for its next change)."""
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"}, attempts={"c-main": 1})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=1))
    real = StateDir.save

    def full(self: StateDir, record: object, containers: object = None, *, sync_dir: bool = True, **kw: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(StateDir, "save", full)
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert saved_containers(tmp_path) == []
    monkeypatch.setattr(StateDir, "save", real)
    await hook.learner.pass_once()
    assert saved_containers(tmp_path) == [["main", 1]]
