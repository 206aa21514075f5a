"""The reconcile pass when a cgroup cannot be put right: each failure warned
of once per pod or container and reason, values written before it logged and
counted, a missing container cgroup told from one that ended; and which
containers the listing has it keep."""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import pytest

from cri_api.v1 import api_pb2 as v1

from hooks.batchresource.cgroups import CgroupFiles
from hooks.batchresource.reconcile import (
    CONTAINER_FAILED,
    CONTAINER_RESTORED,
    NO_CGROUP,
    POD_FAILED,
    POD_RESTORED,
    Reconciler,
    reconcile_once,
)

from .fakecgroup import make_cgroup, read, write
from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, container_request, pod_request
from .learnfixtures import MIB, TWO, hook_with_learner
from .specs import BE
from .test_reconcile_containers import MAIN, SIDE, told_hook


def said(caplog: pytest.LogCaptureFixture, message: str) -> list[int]:
    return [r.levelno for r in caplog.records if r.getMessage() == message]


async def test_a_failure_is_warned_of_once_until_the_cgroup_is_put_right(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """(before: warned every pass, forever, for a container that could not be fixed)"""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    reconciler = Reconciler(hook.pods)
    write(root, 1, MAIN, "memory.limit_in_bytes", str(512 * MIB))
    caplog.set_level(logging.DEBUG, "hooks.batchresource")
    for usage in (300, 301, 302):  # (a usage that moves each pass is the same failure)
        write(root, 1, MAIN, "memory.usage_in_bytes", str(usage * MIB))
        reconciler.once()
    assert said(caplog, CONTAINER_FAILED) == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    write(root, 1, MAIN, "memory.usage_in_bytes", str(10 * MIB))
    assert reconciler.once() == 1  # put right: a later failure is news again
    caplog.clear()
    write(root, 1, MAIN, "memory.limit_in_bytes", str(512 * MIB))
    write(root, 1, MAIN, "memory.usage_in_bytes", str(300 * MIB))
    reconciler.once()
    assert said(caplog, CONTAINER_FAILED) == [logging.WARNING]


async def test_a_pod_failure_is_warned_of_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    reconciler = Reconciler(hook.pods)
    write(root, 1, POD_PARENT, "memory.limit_in_bytes", str(4096 * MIB))
    write(root, 1, POD_PARENT, "memory.usage_in_bytes", str(1024 * MIB))
    caplog.set_level(logging.DEBUG, "hooks.batchresource")
    reconciler.once()
    reconciler.once()
    assert said(caplog, POD_FAILED) == [logging.WARNING, logging.DEBUG]


async def test_values_written_before_a_failed_pod_raise_are_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What was written before a pod's raise failed is logged (before: neither
    logged nor counted); its container's shares, which need no raise of the
    pod, are put back all the same (test_reconcile_unraised.py)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, "cpu.shares", "2")
    write(root, 1, POD_PARENT, "cpu.cfs_quota_us", "1000")
    write(root, 1, MAIN, "cpu.shares", "2")
    real = CgroupFiles._write  # noqa: SLF001

    def refused(files: CgroupFiles, name: str, value: str) -> None:
        if name == "cpu.cfs_quota_us" and str(files.relative) == POD_PARENT.lstrip("/"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", refused)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 2
    assert [(r.getMessage(), r.file) for r in caplog.records if r.getMessage() in (POD_RESTORED, CONTAINER_RESTORED)] == [
        (POD_RESTORED, "cpu.shares"), (CONTAINER_RESTORED, "cpu.shares")]
    assert said(caplog, POD_FAILED) == [logging.WARNING]
    assert read(root, 1, MAIN, "cpu.shares") == "512"


async def test_a_container_cgroup_missing_after_another_listing_is_warned_of_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Missing at one pass: ended since the listing (debug). Still missing once
    a later listing saw it running: not where the hook looks (a cgroup_driver
    that does not match the runtime's), warned of once (before: skipped
    silently every pass)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    for controller in ("cpu", "memory"):
        shutil.rmtree(root / controller / MAIN.lstrip("/"))
    reconciler = Reconciler(hook.pods)
    caplog.set_level(logging.DEBUG, "hooks.batchresource")
    reconciler.once()
    assert said(caplog, NO_CGROUP) == []
    assert hook.learner is not None
    await hook.learner.pass_once()  # listed running again
    reconciler.once()
    reconciler.once()
    assert said(caplog, NO_CGROUP) == [logging.WARNING, logging.DEBUG]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (warning.container, warning.container_id, warning.cgroup) == ("main", "c-main", MAIN.lstrip("/"))


async def test_a_container_that_ends_during_the_write_is_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook, _ = await told_hook(tmp_path, **{"c-main": "main", "c-side": "side"})
    root = tmp_path / "cgroup"
    write(root, 1, MAIN, "cpu.shares", "2")
    write(root, 1, SIDE, "cpu.shares", "2")
    real = CgroupFiles._write  # noqa: SLF001

    def gone(files: CgroupFiles, name: str, value: str) -> None:
        if str(files.relative) == MAIN.lstrip("/"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", gone)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert read(root, 1, SIDE, "cpu.shares") == "256"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_the_containers_of_a_pod_the_listing_learned_and_still_waits_on_are_kept(tmp_path: Path) -> None:
    """A pod learned with a container waiting (its memory above its batch limit)
    is listed among the pods to take up again, not the known ones: the one it
    wrote is kept all the same."""
    root = tmp_path / "cgroup"
    for rel in (POD_PARENT, MAIN, SIDE):
        make_cgroup(root, 1, rel)
    write(root, 1, SIDE, "memory.usage_in_bytes", str(100 * MIB))  # above side's 64Mi
    hook, _ = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main", "c-side": "side"}))
    assert hook.learner is not None
    assert await hook.learner.pass_once() == ["uid-1"]
    await hook.learner.pass_once()
    assert hook.learner.waiting == {"uid-1"}
    write(root, 1, MAIN, "cpu.shares", "2")
    assert reconcile_once(hook.pods) == 1
    assert read(root, 1, MAIN, "cpu.shares") == "512"


async def test_a_listed_pod_the_hook_does_not_know_keeps_no_containers(tmp_path: Path) -> None:
    """Ids a listing gave for a pod the hook did not know then (forgotten while
    it was awaited) are not kept for it once a hook call tells it again."""
    hook, _ = hook_with_learner(tmp_path)
    hook.pods.set_owned({"uid-1": {"c-old": "main"}})
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    assert hook.pods.owned("uid-1") == {}


async def test_a_container_created_not_started_is_not_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Answered at PreCreateContainer, listed CREATED: no cgroup yet, so neither
    looked for nor warned of, however many listings see it so."""
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"}, container_state=v1.CONTAINER_CREATED)
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main"))
    assert hook.learner is not None
    reconciler = Reconciler(hook.pods)
    caplog.set_level(logging.DEBUG, "hooks.batchresource")
    for _ in range(2):
        await hook.learner.pass_once()
        reconciler.once()
    assert hook.pods.owned("uid-1") == {}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_forgotten_pod_keeps_no_containers(tmp_path: Path) -> None:
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    assert hook.pods.owned("uid-1") == {"c-main": "main"}
    await hook.post_stop_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    root = tmp_path / "cgroup"
    write(root, 1, MAIN, "cpu.shares", "2")
    assert hook.pods.owned("uid-1") == {}
    reconcile_once(hook.pods)
    assert read(root, 1, MAIN, "cpu.shares") == "2"


async def test_a_container_under_the_systemd_driver_is_put_back(tmp_path: Path) -> None:
    """Guards existing behaviour: containerd's cri-containerd-<id>.scope under the pod's slice."""
    parent = "kubepods-besteffort-poduid_1.slice"
    pod_dir = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_1.slice"
    scope = f"{pod_dir}/cri-containerd-c-main.scope"
    root = tmp_path / "cgroup"
    for rel in (pod_dir, scope):
        make_cgroup(root, 2, rel)
    hook, _ = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, TWO, cgroup_parent=parent,
                                                  containers={"c-main": "main"}), version=2)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO, cgroup_parent=parent))
    await hook.pre_create_container(container_request(BE, TWO, "main", cgroup_parent=parent))
    assert hook.learner is not None
    await hook.learner.pass_once()
    write(root, 2, scope, "cpu.max", "max 100000")
    write(root, 2, scope, "memory.max", "max")
    reconcile_once(hook.pods)
    assert (read(root, 2, scope, "cpu.max"), read(root, 2, scope, "memory.max")) == ("50000 100000", str(128 * MIB))
