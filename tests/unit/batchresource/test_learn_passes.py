"""The runtime listing over passes: pods stopped while a pass awaits the
runtime, containers waiting, and pods the listing cannot take (each looked at
closer once, not every pass)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cri_api.v1 import api_pb2 as v1
from hooks.batchresource.learn import LEARNED

from .fakecgroup import write
from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, pod_request
from .learnfixtures import KUBELET_V1, MIB, ONE, hook_with_learner, kubelet_be_cgroups, learner_for, values
from .specs import BE, annotation

CLOSER = ["ListPodSandbox", "ListContainers", "PodSandboxStatus"]  # a pass that looks at a pod closer
KNOWN = ["ListPodSandbox", "ListContainers"]  # a pass over a known pod: its containers only
STATE = Path("state") / "uid-1.json"


async def test_an_unknown_pod_stopped_after_the_runtime_showed_it_ready_is_not_taken_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, f"{POD_PARENT}/c-main")
    hook, stub = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, ONE, containers={"c-main": "main"}))

    async def kubelet_stops_it() -> None:  # its status read ready, then stopped: PostStopPodSandbox
        await hook.post_stop_pod_sandbox(pod_request(BE, ONE))

    stub.during["PodSandboxStatus"] = kubelet_stops_it
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert hook.learner is not None and await hook.learner.pass_once() == []
    assert hook.pods.records() == [] and not (tmp_path / STATE).exists()
    assert values(root, 1, POD_PARENT) == KUBELET_V1 and values(root, 1, f"{POD_PARENT}/c-main") == KUBELET_V1
    assert LEARNED not in caplog.text


async def test_a_pod_whose_status_is_no_longer_ready_is_left_out(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, ONE)
    learner, stub = learner_for(tmp_path, pod)

    async def stopped() -> None:  # after ListPodSandbox, before its status: no hook told
        pod.state = v1.SANDBOX_NOTREADY

    stub.during["ListContainers"] = stopped
    assert await learner.pass_once() == []
    assert learner.pods.records() == [] and values(root, 1, POD_PARENT) == KUBELET_V1


async def test_a_waiting_pod_stopped_while_its_containers_are_listed_stays_forgotten(tmp_path: Path) -> None:
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, ONE, containers={"c-main": "main"}, container_state=v1.CONTAINER_CREATED)
    hook, stub = hook_with_learner(tmp_path, pod)
    assert hook.learner is not None and await hook.learner.pass_once() == ["uid-1"]
    assert hook.learner.waiting == {"uid-1"} and (tmp_path / STATE).exists()

    async def kubelet_stops_it() -> None:
        await hook.post_stop_pod_sandbox(pod_request(BE, ONE))

    stub.during["ListContainers"] = kubelet_stops_it
    assert await hook.learner.pass_once() == []
    assert hook.pods.records() == [] and not (tmp_path / STATE).exists()  # PostStopPodSandbox's removal stands
    assert hook.learner.waiting == set()


async def test_a_container_over_its_batch_memory_is_left_whole_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cgroup"
    container_cgroup = f"{POD_PARENT}/c-main"
    kubelet_be_cgroups(root, 1, POD_PARENT, container_cgroup)
    write(root, 1, container_cgroup, "memory.usage_in_bytes", str(200 * MIB))  # its batch limit: 128Mi
    learner, stub = learner_for(tmp_path, FakePod("p-1", "uid-1", BE, ONE, containers={"c-main": "main"}))
    caplog.set_level(logging.INFO, "hooks.batchresource")
    for _ in range(2):
        stub.calls.clear()
        await learner.pass_once()
        assert stub.calls == CLOSER  # waiting: looked at again
        assert values(root, 1, container_cgroup) == KUBELET_V1  # nothing written: not its shares and quota alone
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "retried next pass" in warning.getMessage() and warning.container_id == "c-main"
    assert "below the current usage" in warning.reason
    assert "set a container cgroup value" not in caplog.text
    write(root, 1, container_cgroup, "memory.usage_in_bytes", str(100 * MIB))
    await learner.pass_once()
    assert values(root, 1, container_cgroup) == ("512", "50000", str(128 * MIB))
    assert [r.field for r in caplog.records if r.getMessage() == "batchresource set a container cgroup value"] == [
        "cpu_shares", "cpu_quota", "memory_limit"]
    stub.calls.clear()
    await learner.pass_once()
    assert stub.calls == KNOWN  # written: no longer waiting


async def test_a_running_container_without_a_cgroup_is_warned_of_once_and_not_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)  # no cgroup for c-main (another driver's path, say)
    learner, stub = learner_for(tmp_path, FakePod("p-1", "uid-1", BE, ONE, containers={"c-main": "main"}))
    passes = []
    for _ in range(3):
        stub.calls.clear()
        await learner.pass_once()
        passes.append(list(stub.calls))
    assert passes == [CLOSER, KNOWN, KNOWN]  # no status read again (its container is looked for, warned of once)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "running container" in warning.getMessage() and warning.cgroup == "kubepods/besteffort/poduid-1/c-main"


@pytest.mark.parametrize("case", ["malformed spec", "no cgroup parent", "unmappable parent", "no pod cgroup"])
async def test_a_pod_the_listing_cannot_take_is_looked_at_closer_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    spec, parent = ONE, POD_PARENT
    if case == "malformed spec":
        spec = annotation({"main": {"limits": {"kubernetes.io/batch-cpu": "lots"}}})
    elif case == "no cgroup parent":
        parent = ""
    elif case == "unmappable parent":
        parent = "/kubepods/../besteffort"
    if case != "no pod cgroup":
        kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    learner, stub = learner_for(tmp_path, FakePod("p-1", "uid-1", BE, spec, parent, containers={"c-main": "main"}))
    passes = []
    for _ in range(3):
        stub.calls.clear()
        assert await learner.pass_once() == []
        passes.append(list(stub.calls))
    assert passes == [CLOSER, ["ListPodSandbox"], ["ListPodSandbox"]]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.pod_sandbox_id == "p-1" and learner.pods.records() == []
    assert learner.refused == {"p-1"}
    stub.pods.clear()  # the sandbox removed: its id goes
    await learner.pass_once()
    assert learner.refused == set()
