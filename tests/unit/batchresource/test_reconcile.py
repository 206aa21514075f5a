import asyncio
import dataclasses
import logging
import shutil
from pathlib import Path, PurePosixPath

import pytest

from hooks.batchresource import reconcile
from hooks.batchresource.apply import MemoryBelowUsage, apply_values
from hooks.batchresource.cgroups import CgroupDriver, CgroupFiles, Field
from hooks.batchresource.reconcile import reconcile_once
from hooks.batchresource.resources import UNLIMITED, CgroupValues

from .fakecgroup import make_cgroup, read, write
from .hookfixtures import POD_PARENT, make_hook, pod_request, restarted_hook
from .specs import BE, annotation, container

MIB = 2**20
ONE = annotation({"main": container("500", "128Mi", "500", "128Mi")})


async def run_background(hook, monkeypatch: pytest.MonkeyPatch, passes: int) -> list[float]:
    """Run hook.background() as the hook does until its reconcile loop asked to
    sleep ``passes`` times, then cancel it as the hook's stop does; the sleeps asked."""
    waits: list[float] = []
    enough = asyncio.Event()

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == passes:
            enough.set()
            await asyncio.Event().wait()  # until cancelled

    monkeypatch.setattr(reconcile.asyncio, "sleep", fake_sleep)
    task = asyncio.create_task(hook.background())
    await asyncio.wait_for(enough.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return waits


async def started(tmp_path: Path, version: int = 1):
    hook = make_hook(tmp_path, version)
    make_cgroup(tmp_path / "cgroup", version, POD_PARENT)
    await hook.pre_run_pod_sandbox(pod_request(BE, ONE))
    return hook


@pytest.mark.parametrize("version", [1, 2])
async def test_restores_values_changed_by_hand_and_logs_each(tmp_path: Path, caplog: pytest.LogCaptureFixture, version: int) -> None:
    hook = await started(tmp_path, version)
    root = tmp_path / "cgroup"
    assert reconcile_once(hook.pods) == 0  # nothing to do
    if version == 1:
        write(root, 1, POD_PARENT, "cpu.cfs_quota_us", "200000")
        write(root, 1, POD_PARENT, "memory.limit_in_bytes", "-1")
    else:
        write(root, 2, POD_PARENT, "cpu.max", "200000 100000")
        write(root, 2, POD_PARENT, "memory.max", "max")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 2
    if version == 1:
        assert read(root, 1, POD_PARENT, "cpu.cfs_quota_us") == "50000"
        assert read(root, 1, POD_PARENT, "memory.limit_in_bytes") == str(128 * MIB)
    else:
        assert read(root, 2, POD_PARENT, "cpu.max") == "50000 100000"
        assert read(root, 2, POD_PARENT, "memory.max") == str(128 * MIB)
    lines = [r for r in caplog.records if r.getMessage().startswith("batchresource reconcile restored")]
    logged = [(r.pod, r.field, r.found, r.wanted) for r in lines]  # `wanted`, as the container line names it
    assert [r.restored for r in lines] == [r.wanted for r in lines]  # (and `restored`, as the docs named it first)
    assert logged == [("team-a/batch-job", "cpu_quota", 200000, 50000), ("team-a/batch-job", "memory_limit", UNLIMITED, 128 * MIB)]


async def test_a_restarted_hook_reconciles_what_the_old_one_knew(tmp_path: Path) -> None:
    await started(tmp_path)
    write(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares", "2")
    restarted = await restarted_hook(tmp_path)
    assert reconcile_once(restarted.pods) == 1
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "512"


async def test_forgets_pods_whose_cgroup_is_gone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = await started(tmp_path)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    shutil.rmtree(tmp_path / "cgroup" / "cpu" / POD_PARENT.lstrip("/"))
    assert reconcile_once(hook.pods) == 0
    assert "uid-1" not in hook.pods
    await hook.pods.settled()  # (its file removed in the state files' thread, not waited for by the pass)
    assert not (tmp_path / "state" / "uid-1.json").exists()
    assert any(getattr(r, "reason", "") == "pod cgroup is gone" for r in caplog.records)


async def test_memory_below_usage_is_not_written_but_the_rest_is(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = await started(tmp_path)
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, "memory.limit_in_bytes", str(512 * MIB))
    write(root, 1, POD_PARENT, "memory.usage_in_bytes", str(300 * MIB))
    write(root, 1, POD_PARENT, "cpu.shares", "4")
    write(root, 1, POD_PARENT, "cpu.cfs_quota_us", "200000")  # lowered, as the memory limit would be
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 2  # the values written are counted and logged all the same
    restored = [r.file for r in caplog.records if r.getMessage().startswith("batchresource reconcile restored")]
    assert restored == ["cpu.shares", "cpu.cfs_quota_us"]
    assert read(root, 1, POD_PARENT, "cpu.cfs_quota_us") == "50000"
    assert read(root, 1, POD_PARENT, "memory.limit_in_bytes") == str(512 * MIB)
    assert read(root, 1, POD_PARENT, "cpu.shares") == "512"
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert warning.pod == "team-a/batch-job" and "below the current usage" in warning.reason
    assert "uid-1" in hook.pods  # tried again next pass


async def test_background_runs_a_pass_at_once_then_every_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hook = await started(tmp_path)
    write(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares", "2")
    assert await run_background(hook, monkeypatch, 2) == [10.0, 10.0]
    assert read(tmp_path / "cgroup", 1, POD_PARENT, "cpu.shares") == "512"


async def test_a_failing_pass_does_not_end_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    hook = await started(tmp_path)
    passes: list[int] = []

    def boom(self: reconcile.Reconciler) -> int:
        passes.append(1)
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(reconcile.Reconciler, "once", boom)
    await run_background(hook, monkeypatch, 2)
    assert len(passes) == 2 and "reconcile pass failed" in caplog.text


def test_raise_only_writes_only_what_grows(tmp_path: Path) -> None:
    make_cgroup(tmp_path, 1, "p")
    files = CgroupFiles(tmp_path, 1, PurePosixPath("p"))
    write(tmp_path, 1, "p", "cpu.cfs_quota_us", "10000")
    write(tmp_path, 1, "p", "memory.limit_in_bytes", str(64 * MIB))
    wanted = CgroupValues(cpu_shares=512, cpu_quota=UNLIMITED, memory_limit=32 * MIB)
    changes = apply_values(files, wanted, raise_only=True)
    assert [c.field for c in changes] == [Field.CPU_QUOTA]  # -1 is more than any quota; shares and memory shrink
    assert files.read() == CgroupValues(cpu_shares=1024, cpu_quota=UNLIMITED, memory_limit=64 * MIB)
    assert [c.field for c in apply_values(files, wanted)] == [Field.CPU_SHARES, Field.MEMORY_LIMIT]


def test_lowering_memory_checks_usage_first(tmp_path: Path) -> None:
    make_cgroup(tmp_path, 1, "p")
    files = CgroupFiles(tmp_path, 1, PurePosixPath("p"))
    write(tmp_path, 1, "p", "memory.usage_in_bytes", str(100 * MIB))
    with pytest.raises(MemoryBelowUsage):
        apply_values(files, CgroupValues(cpu_shares=1024, cpu_quota=UNLIMITED, memory_limit=50 * MIB))


async def test_a_pod_whose_cgroup_parent_maps_to_no_cgroup_stops_no_other(tmp_path: Path) -> None:
    hook = await started(tmp_path)  # uid-1, under POD_PARENT
    root = tmp_path / "cgroup"
    await hook.pre_run_pod_sandbox(pod_request(BE, ONE, cgroup_parent="kubepods--odd.slice", uid="uid-0"))
    assert "uid-0" not in hook.pods  # never tracked: it could never be written
    write(root, 1, POD_PARENT, "cpu.cfs_quota_us", "-1")
    assert reconcile_once(hook.pods) == 1
    assert read(root, 1, POD_PARENT, "cpu.cfs_quota_us") == "50000"


async def test_a_saved_pod_whose_cgroup_parent_maps_to_no_cgroup_is_forgotten(tmp_path: Path) -> None:
    hook = await started(tmp_path)
    odd = dataclasses.replace(hook.pods.records()[0], uid="uid-0", cgroup_parent="kubepods--odd.slice")
    hook.pods._pods["uid-0"] = odd  # noqa: SLF001 - as an older version left it in its state
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, "cpu.cfs_quota_us", "-1")
    assert reconcile_once(hook.pods) == 1
    assert "uid-0" not in hook.pods and read(root, 1, POD_PARENT, "cpu.cfs_quota_us") == "50000"


async def test_a_state_directory_that_cannot_be_written_loses_no_cgroup_write(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file, not a directory")
    hook = make_hook(tmp_path, 1)
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    await hook.pre_run_pod_sandbox(pod_request(BE, ONE))
    assert read(root, 1, POD_PARENT, "cpu.cfs_quota_us") == "50000"
    write(root, 1, POD_PARENT, "cpu.cfs_quota_us", "-1")
    assert reconcile_once(hook.pods) == 1  # and it is tracked: the reconcile loop restores it
    assert read(root, 1, POD_PARENT, "cpu.cfs_quota_us") == "50000"


@pytest.mark.parametrize("configured", [None, 1])
async def test_background_logs_its_settings_once_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, configured: int | None
) -> None:
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("cpu memory\n")  # a unified hierarchy: detected as 2
    hook = make_hook(tmp_path, configured, cgroup_driver=CgroupDriver.SYSTEMD, reconcile_interval=5.0)

    with caplog.at_level(logging.INFO, logger="hooks.batchresource"):
        await run_background(hook, monkeypatch, 1)
    [record] = [r for r in caplog.records if r.getMessage() == "batchresource settings"]
    assert record.levelno == logging.INFO
    assert (record.cgroup_version, record.cgroup_version_from) == ((1, "config") if configured else (2, "detected"))
    assert (record.cgroup_root, record.cgroup_driver, record.state_dir) == (
        str(tmp_path / "cgroup"), "systemd", str(tmp_path / "state"))
    assert (record.reconcile_interval, record.cfs_quota_enabled, record.known_pods) == (5.0, True, 0)
