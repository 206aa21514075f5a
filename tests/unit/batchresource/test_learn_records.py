"""How many containers a known pod's state file lists, and what the listing
adopts from an older version's file: restarts never grow the list, and the
hook's own answers are never taken as untold."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from cri_api.v1 import api_pb2 as v1
from hooks.batchresource.learn import ADOPTED, UNTOLD
from hooks.batchresource.server import BatchResourceHook
from hooks.batchresource.state import StateDir

from .fakecgroup import write
from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, container_request, make_hook, pod_request, restarted_hook
from .learnfixtures import KUBELET_V1, TWO, hook_with_learner, kubelet_be_cgroups, values
from .specs import BE, annotation, container

MAIN, SIDE, EXTRA = f"{POD_PARENT}/c-main", f"{POD_PARENT}/c-side", f"{POD_PARENT}/c-extra"
STATE = Path("state") / "uid-1.json"
WITH_INIT = annotation({"main": container("500", "128Mi", "500", "128Mi")}, init={"init": container("100", "64Mi", "100", "64Mi")})


def saved_containers(tmp_path: Path) -> list[list[object]] | None:
    return json.loads((tmp_path / STATE).read_text()).get("containers")


def old_version_file(tmp_path: Path) -> None:
    """A state file written before the containers list existed."""
    (tmp_path / "state").mkdir()
    (tmp_path / STATE).write_text(json.dumps({"uid": "uid-1", "namespace": "team-a", "name": "batch-job",
                                              "cgroup_parent": POD_PARENT, "spec": TWO["node.koordinator.sh/extended-resource-spec"]}))


async def pass_once(hook: BatchResourceHook) -> None:
    assert hook.learner is not None
    await hook.learner.pass_once()


async def test_a_container_restarted_50_times_leaves_one_attempt_in_the_file(tmp_path: Path) -> None:
    """CrashLoopBackOff: each attempt exits before a pass sees it live; the
    init container ran once and exited. Before: a record was dropped only by
    a live container of a higher attempt, so 50 restarts left 50 entries."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, WITH_INIT, container_state=v1.CONTAINER_EXITED)
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, WITH_INIT))
    await hook.pre_create_container(container_request(BE, WITH_INIT, "init"))
    pod.containers["c-init"] = "init"
    for attempt in range(50):
        await hook.pre_create_container(container_request(BE, WITH_INIT, "main", attempt=attempt))
        pod.containers = {"c-init": "init", f"c-main-{attempt}": "main"}  # (kubelet keeps the last exited one)
        pod.attempts = {f"c-main-{attempt}": attempt}
        await pass_once(hook)
    assert saved_containers(tmp_path) == [["init", 0], ["main", 49]]


async def test_an_answer_drops_the_names_lower_attempts(tmp_path: Path) -> None:
    """Kubelet makes attempt N only once N-1 ended, so the hook's answer alone
    drops it, seen by no pass (before: kept until a pass listed a higher attempt)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, TWO))
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    for attempt in range(50):
        await hook.pre_create_container(container_request(BE, TWO, "main", attempt=attempt))
    assert hook.pods.containers("uid-1") == frozenset({("main", 49)})


async def test_an_attempt_the_runtime_lists_exited_drops_the_lower_one_recorded(tmp_path: Path) -> None:
    """Main made again while the hook was down, and exited: its attempt 0
    never comes back (before: kept, as no higher attempt was seen live)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, TWO)
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main"))
    await pass_once(hook)
    assert saved_containers(tmp_path) == [["main", 0]]
    pod.containers, pod.attempts, pod.container_states = {"c-main": "main"}, {"c-main": 1}, {"c-main": v1.CONTAINER_EXITED}
    await pass_once(hook)
    assert saved_containers(tmp_path) == []


async def test_an_answer_given_before_adoption_is_kept_as_the_hooks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An older version's file: side answered, not created yet, as the first
    pass adopts the running main. Before: the answer was thrown away, so
    once created side was taken as untold and another writer's value overwritten."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, MAIN)
    old_version_file(tmp_path)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pods.load()
    await hook.pre_create_container(container_request(BE, TWO, "side"))
    await pass_once(hook)
    assert saved_containers(tmp_path) == [["main", 0], ["side", 0]]
    kubelet_be_cgroups(root, 1, SIDE)
    pod.containers["c-side"] = "side"
    write(root, 1, SIDE, "cpu.shares", "900")  # created with the hook's answer, then another writer's value
    caplog.set_level(logging.INFO, "hooks.batchresource")
    await pass_once(hook)
    assert values(root, 1, SIDE)[0] == "900" and not [r for r in caplog.records if r.getMessage() == UNTOLD]


async def test_an_empty_list_adopted_is_saved_so_it_is_adopted_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No container running at the first pass: the empty list is saved all
    the same, so a restarted hook does not adopt (and log) again."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    old_version_file(tmp_path)
    pod = FakePod("p-1", "uid-1", BE, TWO)
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pods.load()
    caplog.set_level(logging.INFO, "hooks.batchresource")
    await pass_once(hook)
    assert saved_containers(tmp_path) == []
    again, _ = hook_with_learner(tmp_path, pod)
    await again.pods.load()
    await pass_once(again)
    assert [r.containers for r in caplog.records if r.getMessage() == ADOPTED] == [0]


async def test_adoption_leaves_out_a_container_the_spec_does_not_name(tmp_path: Path) -> None:
    """Before: adopted too, though the hook refuses it."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT, MAIN, EXTRA)
    old_version_file(tmp_path)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main", "c-extra": "extra"})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pods.load()
    await pass_once(hook)
    assert saved_containers(tmp_path) == [["main", 0]]


async def test_a_learned_pods_container_the_spec_does_not_name_is_left_alone_unwarned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As for a known pod (before: warned of as a container left unchanged)."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, MAIN, EXTRA)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main", "c-extra": "extra"})
    hook, _ = hook_with_learner(tmp_path, pod)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    await pass_once(hook)
    assert values(root, 1, EXTRA) == KUBELET_V1 and values(root, 1, MAIN) != KUBELET_V1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert saved_containers(tmp_path) == [["main", 0]]


async def test_a_save_that_keeps_failing_is_warned_of_once_then_its_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: warned of every pass, for every pod, as 'tracked until the hook restarts'."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, TWO))
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    real = StateDir.save

    def full(self: StateDir, record: object, containers: object = None, *, sync_dir: bool = True, **kw: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(StateDir, "save", full)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    for attempt in range(3):
        await hook.pre_create_container(container_request(BE, TWO, "main", attempt=attempt))
        await pass_once(hook)
    monkeypatch.setattr(StateDir, "save", real)
    await pass_once(hook)
    said = [(r.levelname, r.getMessage().split(";")[0]) for r in caplog.records if "state directory" in r.getMessage()]
    assert said == [("WARNING", "batchresource could not save a pod to its state directory"),
                    ("INFO", "batchresource saved a pod to its state directory again")]
    assert saved_containers(tmp_path) == [["main", 2]]
    assert (await restarted_hook(tmp_path)).pods.containers("uid-1") == frozenset({("main", 2)})


async def test_a_pod_saved_without_a_listing_is_adopted_once_one_is_enabled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No runtime_endpoint: no answer is recorded, so the file keeps no list,
    and a listing enabled later adopts the running containers (before: an
    empty list was saved, so every running container was taken as untold
    and its value overwritten)."""
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, MAIN)
    without = make_hook(tmp_path)
    await without.pods.load()
    await without.pre_run_pod_sandbox(pod_request(BE, TWO))
    await without.pre_create_container(container_request(BE, TWO, "main"))
    assert saved_containers(tmp_path) is None
    write(root, 1, MAIN, "cpu.shares", "900")  # a later hook in the chain changed the answer
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pods.load()
    caplog.set_level(logging.INFO, "hooks.batchresource")
    await pass_once(hook)
    assert values(root, 1, MAIN)[0] == "900" and not [r for r in caplog.records if r.getMessage() == UNTOLD]
    assert saved_containers(tmp_path) == [["main", 0]]
