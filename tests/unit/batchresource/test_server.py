import errno
import logging
from pathlib import Path

import pytest

from hooks.batchresource.cgroups import CgroupFiles, Field
from hooks.batchresource.resources import CgroupValues
from hooks.batchresource.server import BatchResourceHook
from hooks.batchresource.spec import ANNOTATION_SPEC, LABEL_QOS
from hooks.builtin import HookConfigInvalid, load_builtin
from runtimeproxy.hookpath.points import HookType

from .fakecgroup import make_cgroup, read, write
from .hookfixtures import POD_PARENT, container_request, make_hook, pod_request, restarted_hook
from .specs import BE, annotation, container

MIB = 2**20
ONE = annotation({"main": container("500", "128Mi", "500", "128Mi")})
TWO = annotation({"main": container("500", "128Mi", "500", "128Mi"), "side": container("1k", "64Mi", "1k", "64Mi")})


def test_builtin_interface(tmp_path: Path) -> None:
    assert load_builtin("batchresource") is BatchResourceHook
    assert set(BatchResourceHook.HOOKS) == {
        HookType.PRE_RUN_POD_SANDBOX, HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES, HookType.POST_STOP_POD_SANDBOX}
    hook = BatchResourceHook.from_config(str(tmp_path / "s.sock"), {"state_dir": str(tmp_path / "st"), "reconcile_interval": "1s"})
    assert hook.config.reconcile_interval == 1.0
    with pytest.raises(HookConfigInvalid):
        BatchResourceHook.from_config(str(tmp_path / "s.sock"), {"nope": 1})


@pytest.mark.parametrize("version", [1, 2])
async def test_be_pod_gets_pod_cgroup_values_and_answer(tmp_path: Path, version: int) -> None:
    hook = make_hook(tmp_path, version)
    root = tmp_path / "cgroup"
    make_cgroup(root, version, POD_PARENT)
    answer = await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    assert (answer.resources.cpu_shares, answer.resources.cpu_quota, answer.resources.cpu_period, answer.resources.memory_limit_in_bytes) == (
        1536, 150000, 100000, 192 * MIB)
    if version == 1:
        assert [read(root, 1, POD_PARENT, n) for n in ("cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes")] == [
            "1536", "150000", str(192 * MIB)]
    else:
        assert [read(root, 2, POD_PARENT, n) for n in ("cpu.weight", "cpu.max", "memory.max")] == ["59", "150000 100000", str(192 * MIB)]
    assert (tmp_path / "state" / "uid-1.json").is_file()


async def test_be_pod_by_annotation_and_systemd_parent(tmp_path: Path) -> None:
    hook = make_hook(tmp_path)
    parent = "kubepods-besteffort-poduid_1.slice"
    make_cgroup(tmp_path / "cgroup", 1, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_1.slice")
    await hook.pre_run_pod_sandbox(pod_request({}, {**ONE, LABEL_QOS: "BE"}, cgroup_parent=parent))
    assert read(tmp_path / "cgroup", 1, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_1.slice", "cpu.shares") == "512"


@pytest.mark.parametrize(("labels", "annotations"), [({LABEL_QOS: "LS"}, ONE), ({}, ONE), (BE, {}), ({LABEL_QOS: "LSR"}, {ANNOTATION_SPEC: "{"})])
async def test_other_pods_are_left_alone(tmp_path: Path, labels: dict, annotations: dict) -> None:
    hook = make_hook(tmp_path)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    assert await hook.pre_run_pod_sandbox(pod_request(labels, annotations)) is None
    assert await hook.pre_create_container(container_request(labels, annotations, cpu_shares=2)) is None
    assert await hook.pre_update_container_resources(container_request(labels, annotations, cid="c1")) is None
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "1024"
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("hook_name", ["pre_create_container", "pre_update_container_resources"])
async def test_container_values(tmp_path: Path, hook_name: str) -> None:
    hook = make_hook(tmp_path)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    request = container_request(BE, TWO, name="side", cid="c1", cpu_shares=2, cpu_quota=0, oom_score_adj=1000, cpuset_cpus="0-1")
    answer = await getattr(hook, hook_name)(request)
    res = answer.container_resources
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period, res.memory_limit_in_bytes) == (1024, 100000, 100000, 64 * MIB)
    assert (res.oom_score_adj, res.cpuset_cpus) == (1000, "0-1")  # what the hook does not manage passes through


async def test_cfs_quota_switched_off(tmp_path: Path) -> None:
    hook = make_hook(tmp_path, cfs_quota_enabled=False)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    assert (await hook.pre_run_pod_sandbox(pod_request(BE, ONE))).resources.cpu_quota == -1
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.cfs_quota_us") == "-1"
    assert (await hook.pre_create_container(container_request(BE, ONE))).container_resources.cpu_quota == -1


async def test_container_hook_raises_the_pod_first_but_never_lowers_it(tmp_path: Path) -> None:
    hook = make_hook(tmp_path)
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    write(root, 1, POD_PARENT, "cpu.cfs_quota_us", "20000")  # below the container's 50000
    write(root, 1, POD_PARENT, "memory.limit_in_bytes", str(1024 * MIB))  # above the pod's 192 MiB
    await hook.pre_update_container_resources(container_request(BE, TWO, cid="c1"))
    # Raised before the answer (the runtime then raises the container) ...
    assert read(root, 1, POD_PARENT, "cpu.cfs_quota_us") == "150000"
    # ... lowering waits until the containers have their values (the reconcile loop).
    assert read(root, 1, POD_PARENT, "memory.limit_in_bytes") == str(1024 * MIB)


async def test_container_hook_learns_a_pod_it_did_not_see_start(tmp_path: Path) -> None:
    hook = make_hook(tmp_path)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    write(tmp_path / "cgroup", 1, POD_PARENT, "cpu.cfs_quota_us", "1000")
    await hook.pre_create_container(container_request(BE, ONE))
    assert "uid-1" in hook.pods  # the reconcile loop keeps it from now on
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.cfs_quota_us") == "50000"
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "1024"  # lowering waits


MALFORMED = [
    ({ANNOTATION_SPEC: "{oops"}, "main", "not valid JSON"),
    (annotation({"main": container(limit_cpu="lots")}), "main", "is not a quantity"),
    (annotation({"main": container(limit_memory="-1Gi")}), "main", "negative"),
    (annotation({"main": container(limit_cpu="1e12")}), "main", "absurdly large"),
    # past Python's 4300-digit int conversion limit: the same warning, not a hook failure
    (annotation({"main": container(limit_memory="9" * 5000)}), "main", "no resource quantity"),
    ({ANNOTATION_SPEC: '{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": ' + "9" * 5000 + "}}}}"}, "main", "not valid JSON"),
    (ONE, "sidecar", "'sidecar' is not in"),
]


@pytest.mark.parametrize(("annotations", "name", "reason"), MALFORMED)
async def test_malformed_specs_leave_the_pod_unchanged_and_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, annotations: dict, name: str, reason: str
) -> None:
    hook = make_hook(tmp_path)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    if name == "main":
        assert await hook.pre_run_pod_sandbox(pod_request(BE, annotations)) is None
    assert await hook.pre_create_container(container_request(BE, annotations, name=name)) is None
    assert await hook.pre_update_container_resources(container_request(BE, annotations, name=name, cid="c1")) is None
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.cfs_quota_us") == "-1"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and all(r.pod == "team-a/batch-job" and reason in r.reason for r in warnings)


async def test_a_pod_summing_past_int64_still_gets_its_answer(tmp_path: Path) -> None:
    # 16 containers of 1 EiB each sum to 2**64, which the hook API's int64 cannot hold.
    huge = annotation({f"c{i}": container("1G", "1Ei", "1G", "1Ei") for i in range(16)})
    hook = make_hook(tmp_path)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    answer = await hook.pre_run_pod_sandbox(pod_request(BE, huge))
    assert answer is not None and answer.resources.memory_limit_in_bytes == 2**60
    assert answer.resources.cpu_quota == 1_000_000 * 1000 * 100  # a million cores, the cap
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "memory.limit_in_bytes") == str(2**60)


async def test_memory_limit_below_usage_leaves_the_container_unchanged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = make_hook(tmp_path)
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    make_cgroup(root, 1, f"{POD_PARENT}/c1")
    write(root, 1, f"{POD_PARENT}/c1", "memory.usage_in_bytes", str(200 * MIB))
    assert await hook.pre_update_container_resources(container_request(BE, ONE, cid="c1")) is None
    record = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert record.pod == "team-a/batch-job" and "below the current usage" in record.reason
    write(root, 1, f"{POD_PARENT}/c1", "memory.usage_in_bytes", str(100 * MIB))
    assert (await hook.pre_update_container_resources(container_request(BE, ONE, cid="c1"))).container_resources.memory_limit_in_bytes == 128 * MIB


async def test_pod_cgroup_write_failure_does_not_fail_the_pod(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = make_hook(tmp_path)  # no pod cgroup at all: kubelet did not create it
    answer = await hook.pre_run_pod_sandbox(pod_request(BE, ONE))
    assert answer.resources.cpu_shares == 512
    assert any("could not write the pod cgroup" in r.getMessage() for r in caplog.records)


async def test_pod_values_raised_before_a_refused_one_are_logged_by_the_hook_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod's shares and quota raised, then its memory limit refused: the
    two values that landed are logged by the call, before its warning
    (before: only the warning; the landed values were logged by no one
    until a reconcile pass found nothing left to raise)."""
    hook = make_hook(tmp_path)
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    await hook.pre_run_pod_sandbox(pod_request(BE, ONE))
    for name, value in (("cpu.shares", "2"), ("cpu.cfs_quota_us", "1000"), ("memory.limit_in_bytes", str(64 * MIB))):
        write(root, 1, POD_PARENT, name, value)  # below the pod's values: the container hook raises them
    real_write = CgroupFiles.write

    def refused(self: CgroupFiles, field: Field, wanted: CgroupValues) -> None:
        if field is Field.MEMORY_LIMIT:
            raise OSError(errno.EINVAL, "Invalid argument")
        real_write(self, field, wanted)

    monkeypatch.setattr(CgroupFiles, "write", refused)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="hooks.batchresource")
    assert await hook.pre_create_container(container_request(BE, ONE)) is not None
    said = [(r.getMessage(), getattr(r, "field", None), getattr(r, "new", None)) for r in caplog.records
            if "pod cgroup" in r.getMessage()]
    assert said == [("batchresource set a pod cgroup value", "cpu_shares", 512),
                    ("batchresource set a pod cgroup value", "cpu_quota", 50000),
                    ("batchresource could not write the pod cgroup", None, None)]
    assert (read(root, 1, POD_PARENT, "cpu.shares"), read(root, 1, POD_PARENT, "cpu.cfs_quota_us")) == ("512", "50000")


async def test_post_stop_forgets_the_pod(tmp_path: Path) -> None:
    hook = make_hook(tmp_path)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    await hook.pre_run_pod_sandbox(pod_request(BE, ONE))
    assert "uid-1" in (await restarted_hook(tmp_path)).pods  # a restarted hook knows it
    await hook.post_stop_pod_sandbox(pod_request(BE, ONE))
    assert "uid-1" not in hook.pods
    await hook.pods.settled()  # (its removal is not waited for by the answer)
    assert not (tmp_path / "state" / "uid-1.json").exists()
    assert "uid-1" not in (await restarted_hook(tmp_path)).pods


async def test_pods_with_no_uid_are_tracked_in_memory_each_by_its_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # CRI allows an empty uid (crictl runp with no uid); no state file can be named after it.
    hook = make_hook(tmp_path)
    other = "/kubepods/besteffort/podother"
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)
    make_cgroup(tmp_path / "cgroup", 1, other)
    answer = await hook.pre_run_pod_sandbox(pod_request(BE, ONE, uid=""))
    second = pod_request(BE, ONE, cgroup_parent=other, uid="")
    second.pod_meta.name = "other-job"
    await hook.pre_run_pod_sandbox(second)
    assert answer.resources.cpu_shares == 512
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "512"
    assert any("stays tracked in memory" in r.getMessage() for r in caplog.records)
    assert sorted(r.cgroup_parent for r in hook.pods.records()) == sorted([POD_PARENT, other])
    caplog.clear()
    await hook.post_stop_pod_sandbox(pod_request(BE, ONE, uid=""))  # the first stops: the second is still kept
    assert [r.cgroup_parent for r in hook.pods.records()] == [other]
    assert not any("could not remove" in r.getMessage() for r in caplog.records)
    await hook.post_stop_pod_sandbox(second)
    assert hook.pods.records() == []


async def test_an_unexpected_error_answers_no_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    hook = make_hook(tmp_path)
    make_cgroup(tmp_path / "cgroup", 1, POD_PARENT)

    def broken(*args, **kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(hook.pods, "apply", broken)
    assert await hook.handle(HookType.PRE_RUN_POD_SANDBOX, pod_request(BE, ONE)) is None
    record = next(r for r in caplog.records if r.getMessage().startswith("batchresource hook failed"))
    assert (record.hook, record.pod) == ("PreRunPodSandbox", "team-a/batch-job")


async def test_unreadable_container_cgroup_leaves_the_container_unchanged(tmp_path: Path) -> None:
    hook = make_hook(tmp_path)
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    make_cgroup(root, 1, f"{POD_PARENT}/c1")
    (root / "memory" / POD_PARENT.lstrip("/") / "c1" / "memory.usage_in_bytes").unlink()
    assert await hook.pre_update_container_resources(container_request(BE, ONE, cid="c1")) is None
