"""The reconcile pass under a pod whose raise fails: its containers' values
that need no raise of the pod (shares, lowered, or raised within what the
pod has now) are put back; one raised above the pod waits for a pass that
raises it, said once per pod."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from hooks.batchresource.cgroups import CgroupFiles
from hooks.batchresource.reconcile import CONTAINER_RESTORED, CONTAINERS_WAIT, POD_FAILED, POD_RESTORED, Reconciler

from .fakecgroup import read, write
from .hookfixtures import POD_PARENT
from .learnfixtures import MIB
from .test_cgroups_memsw import MEMSW, MEMSW_USAGE, NO_LIMIT
from .test_reconcile_containers import MAIN, told_hook

QUOTA = "cpu.cfs_quota_us"
LIMIT = "memory.limit_in_bytes"


def refuse_pod_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod cgroup's quota (and period) writes refused (EINVAL), as v1 refuses a quota below a child's."""
    real = CgroupFiles._write  # noqa: SLF001

    def refused(files: CgroupFiles, name: str, value: str) -> None:
        if name in (QUOTA, "cpu.cfs_period_us") and str(files.relative) == POD_PARENT.lstrip("/"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", refused)


def said(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == message]


async def test_container_values_that_need_no_pod_raise_are_put_back_the_rest_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(before: none of the container's values put back while the pod's raise failed)"""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, QUOTA, "1000")  # below its 75000: the raise refused
    write(root, 1, MAIN, "cpu.shares", "2")  # a weight: no parent bound
    write(root, 1, MAIN, QUOTA, "500")  # wants 50000, above the pod's 1000: waits
    write(root, 1, MAIN, "memory.limit_in_bytes", str(1024 * MIB))  # lowered to 128Mi: needs no raise
    refuse_pod_quota(monkeypatch)
    reconciler = Reconciler(hook.pods)
    caplog.set_level(logging.DEBUG, "hooks.batchresource")
    assert reconciler.once() == 2
    assert (read(root, 1, MAIN, "cpu.shares"), read(root, 1, MAIN, QUOTA),
            read(root, 1, MAIN, "memory.limit_in_bytes")) == ("512", "500", str(128 * MIB))
    reconciler.once()
    reconciler.once()
    [wait] = said(caplog, CONTAINERS_WAIT)  # once per pod, not every pass
    assert (wait.levelno, wait.pod, wait.uid, wait.containers) == (logging.INFO, "team-a/batch-job", "uid-1",
                                                                   {"main": ["cpu_quota"]})
    assert [r.levelno for r in said(caplog, POD_FAILED)] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    monkeypatch.undo()  # the pod can be raised: its container then
    assert reconciler.once() == 2
    assert (read(root, 1, POD_PARENT, QUOTA), read(root, 1, MAIN, QUOTA)) == ("75000", "50000")
    caplog.clear()
    write(root, 1, POD_PARENT, QUOTA, "1000")  # again: news again, the pod having been put right
    write(root, 1, MAIN, QUOTA, "500")
    refuse_pod_quota(monkeypatch)
    reconciler.once()
    assert len(said(caplog, CONTAINERS_WAIT)) == 1


async def test_a_container_raise_within_the_pods_current_value_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod's quota at 60000 (its 75000 refused): the container's 50000 fits under it."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, QUOTA, "60000")
    write(root, 1, MAIN, QUOTA, "500")
    refuse_pod_quota(monkeypatch)
    assert Reconciler(hook.pods).once() == 1
    assert read(root, 1, MAIN, QUOTA) == "50000"


async def test_a_container_under_a_pod_whose_period_differs_is_compared_per_period(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60000 per 200000 is 30000 per 100000: below the container's 50000, so it
    waits. Guards the comparison per period (the pass before this change
    skipped every container of such a pod, so it passes there too)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, "cpu.cfs_period_us", "200000")
    write(root, 1, POD_PARENT, QUOTA, "60000")
    write(root, 1, MAIN, QUOTA, "500")
    refuse_pod_quota(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    Reconciler(hook.pods).once()
    assert read(root, 1, MAIN, QUOTA) == "500"
    [wait] = said(caplog, CONTAINERS_WAIT)
    assert wait.containers == {"main": ["cpu_quota"]}


async def test_a_container_whose_period_alone_drifted_is_a_raise_per_period(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container at 100000/400000 (0.25 cpu) wants 50000/100000 (0.5): a
    raise per period, above the pod's 30000/100000 left by its refused raise,
    so it waits (before: its raw quota going down counted it as lowering, and
    it was written above the pod: on v1 the period's write is refused)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, QUOTA, "30000")
    write(root, 1, MAIN, "cpu.cfs_period_us", "400000")
    write(root, 1, MAIN, QUOTA, "100000")
    refuse_pod_quota(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert Reconciler(hook.pods).once() == 0
    assert (read(root, 1, MAIN, "cpu.cfs_period_us"), read(root, 1, MAIN, QUOTA)) == ("400000", "100000")
    [wait] = said(caplog, CONTAINERS_WAIT)
    assert wait.containers == {"main": ["cpu_quota"]}


async def test_a_pod_raised_per_period_is_raised_before_its_containers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod at 100000/400000 (0.25 cpu) wants 75000/100000: a raise, written
    before its container's 50000/100000 (before: its raw quota going down made
    it a lowering, written after the container, which v1 refuses above the pod)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, "cpu.cfs_period_us", "400000")
    write(root, 1, POD_PARENT, QUOTA, "100000")
    write(root, 1, MAIN, QUOTA, "500")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert Reconciler(hook.pods).once() == 2
    order = [(r.getMessage(), r.field) for r in caplog.records if r.getMessage() in (POD_RESTORED, CONTAINER_RESTORED)]
    assert order == [(POD_RESTORED, "cpu_quota"), (CONTAINER_RESTORED, "cpu_quota")]
    assert (read(root, 1, POD_PARENT, "cpu.cfs_period_us"), read(root, 1, POD_PARENT, QUOTA)) == ("100000", "75000")


async def test_a_container_memsw_raise_waits_with_its_memory_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod at 64Mi (its raise refused), its container at 64Mi/64Mi wanting
    128Mi/128Mi: the limit waits, above the pod, and memsw with it (before:
    memsw, compared with the pod's unlimited one, was raised alone: 64Mi of
    swap kubelet never asked for, and the wait line named the limit only)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    for cgroup, memsw in ((MAIN, str(128 * MIB)), (POD_PARENT, NO_LIMIT)):
        write(root, 1, cgroup, MEMSW, memsw)
        write(root, 1, cgroup, MEMSW_USAGE, "0")
    write(root, 1, POD_PARENT, QUOTA, "1000")  # the pod's raise refused at its quota, before its memory
    write(root, 1, POD_PARENT, LIMIT, str(64 * MIB))
    write(root, 1, MAIN, LIMIT, str(64 * MIB))
    write(root, 1, MAIN, MEMSW, str(64 * MIB))
    refuse_pod_quota(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    Reconciler(hook.pods).once()
    assert (read(root, 1, MAIN, LIMIT), read(root, 1, MAIN, MEMSW)) == (str(64 * MIB), str(64 * MIB))
    [wait] = said(caplog, CONTAINERS_WAIT)
    assert wait.containers == {"main": ["memory_limit", "memory_swap"]}


async def test_containers_are_left_when_the_pod_cgroup_cannot_be_read_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards existing behaviour: the pod's raise refused, then its cgroup's
    read again (for what the failed raise left) fails: its containers are
    left for the next pass, not written against values not known."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, QUOTA, "1000")
    write(root, 1, MAIN, "cpu.shares", "2")  # a weight: put back if the pod's values were read
    refuse_pod_quota(monkeypatch)
    real = CgroupFiles.read
    reads: list[str] = []

    def second_pod_read_fails(files: CgroupFiles):
        if str(files.relative) == POD_PARENT.lstrip("/"):
            reads.append("pod")
            if len(reads) > 1:
                raise OSError(errno.EIO, "Input/output error")
        return real(files)

    monkeypatch.setattr(CgroupFiles, "read", second_pod_read_fails)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert Reconciler(hook.pods).once() == 0
    assert reads == ["pod", "pod"]
    assert read(root, 1, MAIN, "cpu.shares") == "2"
    assert said(caplog, CONTAINERS_WAIT) == [] and said(caplog, CONTAINER_RESTORED) == []
