"""Learning BE pods from the runtime's listing: pods made while the hook was down."""

import asyncio
import json
import logging
from pathlib import Path

import grpc
import pytest

from cri_api.v1 import api_pb2 as v1
from hooks.batchresource.config import BatchResourceConfig
from hooks.batchresource.learn import LEARNED, RuntimeLearner
from hooks.batchresource.runtime import RuntimeLister
from hooks.criclient import SKIP_LABEL

from .fakecgroup import read, write
from .fakeruntime import FakeLister, FakePod, FakeRuntimeStub, rpc_error
from .hookfixtures import POD_PARENT, make_hook, pod_request, restarted_hook
from .learnfixtures import MIB, ONE, TWO, hook_with_learner, kubelet_be_cgroups, learner_for, values
from .specs import BE, annotation


@pytest.mark.parametrize("version", [1, 2])
async def test_an_unknown_be_pod_gets_its_state_file_and_the_hooks_values(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version: int
) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, version, POD_PARENT, f"{POD_PARENT}/c-main", f"{POD_PARENT}/c-side")
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main", "c-side": "side"})
    learner, _ = learner_for(tmp_path, pod, version=version)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert await learner.pass_once() == ["uid-1"]
    if version == 1:
        assert values(root, 1, POD_PARENT) == ("768", "75000", str(192 * MIB))
        assert values(root, 1, f"{POD_PARENT}/c-main") == ("512", "50000", str(128 * MIB))
        assert values(root, 1, f"{POD_PARENT}/c-side") == ("256", "25000", str(64 * MIB))
    else:
        assert values(root, 2, POD_PARENT) == ("30", "75000 100000", str(192 * MIB))
        assert values(root, 2, f"{POD_PARENT}/c-main") == ("20", "50000 100000", str(128 * MIB))
    saved = json.loads((tmp_path / "state" / "uid-1.json").read_text())
    assert (saved["namespace"], saved["name"], saved["cgroup_parent"], saved["spec"]) == (
        "team-a", "batch-job", POD_PARENT, TWO["node.koordinator.sh/extended-resource-spec"])
    [line] = [r for r in caplog.records if r.getMessage() == LEARNED]
    assert (line.pod, line.uid, line.pod_sandbox_id, line.containers) == ("team-a/batch-job", "uid-1", "p-1", 2)
    assert "no hook call told of" in line.reason
    # A restarted hook knows it from the state file, as one that ran PreRunPodSandbox would.
    assert (await restarted_hook(tmp_path, version)).pods.records()[0].uid == "uid-1"


async def test_pod_raised_first_containers_then_pod_lowered(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT, f"{POD_PARENT}/c-main")
    learner, _ = learner_for(tmp_path, FakePod("p-1", "uid-1", BE, ONE, containers={"c-main": "main"}))
    caplog.set_level(logging.INFO, "hooks.batchresource")
    await learner.pass_once()
    writes = [(r.getMessage().split()[3], r.field) for r in caplog.records if r.getMessage().startswith("batchresource set a")]
    assert writes == [
        ("pod", "cpu_shares"),  # raising: the pod first
        ("container", "cpu_shares"), ("container", "cpu_quota"), ("container", "memory_limit"),
        ("pod", "cpu_quota"), ("pod", "memory_limit"),  # lowering: after its containers
    ]


async def test_known_pods_and_pods_the_hooks_leave_alone_are_not_learned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cgroup"
    parents = {name: f"/kubepods/besteffort/pod{name}" for name in ("known", "ls", "skip", "nospec", "notready")}
    for parent in parents.values():
        kubelet_be_cgroups(root, 1, parent)
    pods = [
        FakePod("p-known", "known", BE, ONE, parents["known"]),
        FakePod("p-ls", "ls", {"koordinator.sh/qosClass": "LS"}, ONE, parents["ls"]),
        FakePod("p-skip", "skip", {**BE, SKIP_LABEL: "true"}, ONE, parents["skip"]),
        FakePod("p-nospec", "nospec", BE, {}, parents["nospec"]),
        FakePod("p-notready", "notready", BE, ONE, parents["notready"], state=v1.SANDBOX_NOTREADY),
    ]
    hook, stub = make_hook(tmp_path), FakeRuntimeStub(*pods)
    await hook.pre_run_pod_sandbox(pod_request(BE, ONE, parents["known"], uid="known"))
    learner = RuntimeLearner(hook.pods, FakeLister(stub))
    write(root, 1, parents["known"], "cpu.shares", "2")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert await learner.pass_once() == []
    assert stub.calls == ["ListPodSandbox", "ListContainers"]  # no status read: only the known pod's containers
    assert [r.uid for r in learner.pods.records()] == ["known"]
    assert read(root, 1, parents["known"], "cpu.shares") == "2"  # the reconcile loop's to restore, not the listing's
    for name in ("ls", "skip", "nospec", "notready"):
        assert read(root, 1, parents[name], "cpu.shares") == "2"
    assert LEARNED not in caplog.text


async def test_a_malformed_spec_is_warned_of_once_and_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    bad = annotation({"main": {"limits": {"kubernetes.io/batch-cpu": "lots"}}})
    learner, _ = learner_for(tmp_path, FakePod("p-1", "uid-1", BE, bad))
    for _ in range(3):
        assert await learner.pass_once() == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.pod for r in warnings] == ["team-a/batch-job"] and "'lots' is not a quantity" in warnings[0].reason
    assert learner.pods.records() == [] and read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "2"


async def test_a_container_not_started_yet_is_written_on_a_later_pass(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, ONE, containers={"c-main": "main"}, container_state=v1.CONTAINER_CREATED)
    learner, stub = learner_for(tmp_path, pod)
    assert await learner.pass_once() == ["uid-1"]  # created, not started: runc made no cgroup yet
    assert await learner.pass_once() == [] and learner.waiting == {"uid-1"}  # still created: still waiting
    kubelet_be_cgroups(root, 1, f"{POD_PARENT}/c-main")  # started with kubelet's values
    pod.container_state = v1.CONTAINER_RUNNING
    assert await learner.pass_once() == []  # known now, but waiting for that container: looked at again
    assert values(root, 1, f"{POD_PARENT}/c-main") == ("512", "50000", str(128 * MIB))
    stub.calls.clear()
    assert await learner.pass_once() == []
    assert stub.calls == ["ListPodSandbox", "ListContainers"]  # every container written: known like any other pod


async def test_a_failing_listing_is_warned_of_once_then_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    learner, stub = learner_for(tmp_path, FakePod("p-1", "uid-1", BE, ONE))
    stub.fail_with = rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")
    caplog.set_level(logging.DEBUG, "hooks.batchresource")
    assert await learner.pass_once() == [] and await learner.pass_once() == []
    failed = [r for r in caplog.records if r.getMessage().startswith("batchresource cannot list")]
    assert [r.levelno for r in failed] == [logging.WARNING, logging.DEBUG]
    assert (failed[0].runtime_endpoint, failed[0].reason) == ("/fake/runtime.sock", "UNAVAILABLE: connection refused")
    stub.fail_with = None
    assert await learner.pass_once() == ["uid-1"]
    assert "batchresource lists the runtime's pods again" in caplog.text
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "512"


async def test_a_runtime_socket_nobody_listens_on_is_a_logged_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = make_hook(tmp_path)
    learner = RuntimeLearner(hook.pods, RuntimeLister(str(tmp_path / "nobody.sock"), timeout=5))
    try:
        assert await learner.pass_once() == []
    finally:
        await learner.lister.close()
    [failed] = [r for r in caplog.records if r.getMessage().startswith("batchresource cannot list")]
    assert failed.levelno == logging.WARNING and failed.reason.startswith("UNAVAILABLE")


def test_runtime_endpoint_setting(tmp_path: Path) -> None:
    from hooks.builtin import HookConfigInvalid
    from hooks.criclient import DEFAULT_RUNTIME_ENDPOINT

    assert BatchResourceConfig.from_mapping({}).runtime_endpoint == DEFAULT_RUNTIME_ENDPOINT
    assert BatchResourceConfig.from_mapping({"runtime_endpoint": "unix:///run/containerd/containerd.sock"}).runtime_endpoint == (
        "/run/containerd/containerd.sock")
    assert BatchResourceConfig.from_mapping({"runtime_endpoint": ""}).runtime_endpoint == ""
    with pytest.raises(HookConfigInvalid, match="runtime_endpoint 'run/x.sock': expected an absolute socket path"):
        BatchResourceConfig.from_mapping({"runtime_endpoint": "run/x.sock"})
    assert make_hook(tmp_path).learner is None  # "": hook calls only
    assert make_hook(tmp_path, runtime_endpoint="/run/x.sock").learner is not None


async def test_background_lists_the_runtime_beside_the_reconcile_loop_and_the_stop_closes_its_channel(tmp_path: Path) -> None:
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, stub = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, ONE), reconcile_interval=0.01)
    task = asyncio.create_task(hook.background())
    await asyncio.wait_for(stub.listed.wait(), 5)  # a first pass listed
    stub.listed.clear()
    await asyncio.wait_for(stub.listed.wait(), 5)  # a second: the first one ended
    assert [r.uid for r in hook.pods.records()] == ["uid-1"]
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "512"
    await hook.stop()  # as hook run stops it: the hook's stop, then its background cancelled
    assert hook.learner is not None and hook.learner.lister.closed  # the channel closed with it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert asyncio.all_tasks() == {asyncio.current_task()}  # neither loop left running


@pytest.mark.parametrize("version", [1, 2])
async def test_the_quota_switch_reaches_the_listing(tmp_path: Path, version: int) -> None:
    root = tmp_path / "cgroup"
    kubelet_be_cgroups(root, version, POD_PARENT, f"{POD_PARENT}/c-main")
    write(root, version, POD_PARENT, "cpu.cfs_quota_us" if version == 1 else "cpu.max", "90000" if version == 1 else "90000 100000")
    hook, _ = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, ONE, containers={"c-main": "main"}),
                                version=version, cfs_quota_enabled=False)
    assert hook.learner is not None and await hook.learner.pass_once() == ["uid-1"]
    unlimited = "-1" if version == 1 else "max 100000"
    assert values(root, version, f"{POD_PARENT}/c-main")[1:] == (unlimited, str(128 * MIB))
    assert values(root, version, POD_PARENT)[1:] == (unlimited, str(128 * MIB))  # (its 90000 quota lifted)


async def test_a_pod_the_runtime_no_longer_has_is_left_out_and_the_others_learned(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    other = "/kubepods/besteffort/poduid-2"
    kubelet_be_cgroups(root, 1, POD_PARENT, other)
    learner, stub = learner_for(tmp_path, FakePod("p-1", "uid-1", BE, ONE), FakePod("p-2", "uid-2", BE, ONE, other, name="other"))
    stub.not_found.add("p-1")  # removed between ListPodSandbox and its PodSandboxStatus
    assert await learner.pass_once() == ["uid-2"]
    assert [r.uid for r in learner.pods.records()] == ["uid-2"]
    assert read(root, 1, POD_PARENT, "cpu.shares") == "2" and read(root, 1, other, "cpu.shares") == "512"
    assert not (tmp_path / "state" / "uid-1.json").exists()
