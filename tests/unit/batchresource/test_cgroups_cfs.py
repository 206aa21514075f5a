"""cgroup v1's CFS quota and period: the kernel refuses (EINVAL) a write that
leaves a quota per period above a limited parent's or below a limited
child's, each file checked with the other as it is, so the two are written in
runc's order (the period first; on EINVAL the quota, then the period). The
fake refuses as the kernel does (fakecgroup.kernel_like_cfs)."""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath

import pytest

from hooks.batchresource.apply import Change, apply_values
from hooks.batchresource.cgroups import CgroupFiles, Field
from hooks.batchresource.reconcile import POD_RESTORED, reconcile_once
from hooks.batchresource.resources import UNLIMITED, CgroupValues

from .fakecgroup import PERIOD, QUOTA, kernel_like_cfs, make_cgroup, read, write
from .hookfixtures import POD_PARENT
from .test_reconcile_containers import MAIN, restored, told_hook


def tree(root: Path, pod: tuple[int, int], child: tuple[int, int]) -> CgroupFiles:
    """A pod cgroup at ``pod`` (quota, period) with a child at ``child``; the child's files."""
    for relative, (quota, period) in (("pod", pod), ("pod/c", child)):
        make_cgroup(root, 1, relative)
        write(root, 1, relative, PERIOD, str(period))
        write(root, 1, relative, QUOTA, str(quota))
    return CgroupFiles(root, 1, PurePosixPath("pod/c"))


def cfs(quota: int, period: int) -> CgroupValues:
    """Only the quota and period differing from the fake's defaults."""
    return CgroupValues(cpu_shares=1024, cpu_quota=quota, memory_limit=UNLIMITED, cpu_period=period)


def test_a_shorter_period_under_a_limited_parent_goes_after_the_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5 cpu as 100000/200000 put at 25000/50000 under a pod at 0.75: the
    period first would leave 100000/50000 (2 cpus), refused (before: the
    period alone, refused EINVAL every time)."""
    files = tree(tmp_path, (75000, 100000), (100000, 200000))
    writes = kernel_like_cfs(monkeypatch)
    assert apply_values(files, cfs(25000, 50000)) == [Change(Field.CPU_QUOTA, 100000, 25000, QUOTA)]
    assert writes == [("pod/c", QUOTA, "25000"), ("pod/c", PERIOD, "50000")]
    assert (read(tmp_path, 1, "pod/c", QUOTA), read(tmp_path, 1, "pod/c", PERIOD)) == ("25000", "50000")


def test_a_longer_period_above_a_limited_child_goes_after_the_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod at 0.75 cpu as 75000/100000 put at 150000/200000 above its
    child's 0.5: the period first would leave 75000/200000 (0.375), refused
    (before: refused EINVAL every time)."""
    tree(tmp_path, (75000, 100000), (50000, 100000))
    pod = CgroupFiles(tmp_path, 1, PurePosixPath("pod"))
    writes = kernel_like_cfs(monkeypatch)
    assert apply_values(pod, cfs(150000, 200000)) == [Change(Field.CPU_QUOTA, 75000, 150000, QUOTA)]
    assert writes == [("pod", QUOTA, "150000"), ("pod", PERIOD, "200000")]
    assert (read(tmp_path, 1, "pod", QUOTA), read(tmp_path, 1, "pod", PERIOD)) == ("150000", "200000")


@pytest.mark.parametrize(("found", "wanted"), [((50000, 100000), (100000, 200000)), ((25000, 50000), (50000, 100000))])
def test_a_longer_period_under_a_limited_parent_goes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: tuple[int, int], wanted: tuple[int, int]
) -> None:
    """0.5 cpu under a pod at 0.75 given a longer period: the quota first
    would leave 1 cpu, refused; the period first leaves 0.25. Guards existing
    behaviour (the period was always written first)."""
    files = tree(tmp_path, (75000, 100000), found)
    writes = kernel_like_cfs(monkeypatch)
    apply_values(files, cfs(*wanted))
    assert writes == [("pod/c", PERIOD, str(wanted[1])), ("pod/c", QUOTA, str(wanted[0]))]


def test_an_unlimited_quota_is_written_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """v1 takes an unlimited child under a limited parent (it inherits the
    parent's bound) and checks no period against it: the quota alone, the
    period left. Guards existing behaviour."""
    files = tree(tmp_path, (75000, 100000), (50000, 200000))
    writes = kernel_like_cfs(monkeypatch)
    assert apply_values(files, cfs(UNLIMITED, 100000)) == [Change(Field.CPU_QUOTA, 50000, UNLIMITED, QUOTA)]
    assert writes == [("pod/c", QUOTA, "-1")]
    assert not files.differs(files.read(), cfs(UNLIMITED, 100000), Field.CPU_QUOTA)  # (its period is not compared)


def test_a_limit_from_unlimited_with_a_shorter_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unlimited child (-1 per 200000) limited to 50000/100000 under a
    pod at 0.75: the period first is taken (no quota to check it with).
    Guards existing behaviour."""
    files = tree(tmp_path, (75000, 100000), (UNLIMITED, 200000))
    writes = kernel_like_cfs(monkeypatch)
    apply_values(files, cfs(50000, 100000))
    assert writes == [("pod/c", PERIOD, "100000"), ("pod/c", QUOTA, "50000")]


def test_a_write_the_kernel_refuses_either_way_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quota per period above the parent's is refused in both orders: the
    error is raised, as before, and the quota (the second order's first
    write, lowered per period) is all that landed."""
    files = tree(tmp_path, (75000, 100000), (100000, 200000))
    writes = kernel_like_cfs(monkeypatch)
    with pytest.raises(OSError, match="Invalid argument"):
        apply_values(files, cfs(50000, 50000))
    assert writes == [("pod/c", QUOTA, "50000")]


async def test_a_pods_period_drifted_shorter_is_put_back_above_its_limited_container(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod's 0.75 cpu as 37500/50000 put back at 75000/100000 over its
    container's 0.5 (before: its period first, 37500/100000, refused EINVAL
    every pass)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, QUOTA, "37500")
    write(root, 1, POD_PARENT, PERIOD, "50000")
    kernel_like_cfs(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert (read(root, 1, POD_PARENT, QUOTA), read(root, 1, POD_PARENT, PERIOD)) == ("75000", "100000")
    assert [(r.field, r.file, r.found, r.wanted) for r in caplog.records if r.getMessage() == POD_RESTORED] == [
        ("cpu_quota", QUOTA, 37500, 75000)]


async def test_a_containers_period_drifted_longer_is_put_back_under_its_limited_pod(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container's 0.5 cpu as 100000/200000 put back at 50000/100000
    under its pod's 0.75 (before: its period first, 100000/100000, refused
    EINVAL every pass)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, MAIN, PERIOD, "200000")
    write(root, 1, MAIN, QUOTA, "100000")
    kernel_like_cfs(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert (read(root, 1, MAIN, QUOTA), read(root, 1, MAIN, PERIOD)) == ("50000", "100000")
    assert restored(caplog) == [("team-a/batch-job", "main", QUOTA, 100000, 50000)]
