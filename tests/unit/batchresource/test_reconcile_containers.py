"""The reconcile pass and the containers whose values the hook set: a drifted
value is put back (logged once), in the hooks' order, one read per file;
what the hook does not own is left alone."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path, PurePosixPath

import pytest

from hooks.batchresource.apply import apply_values
from hooks.batchresource.cgroups import CgroupFiles, Field
from hooks.batchresource.reconcile import CONTAINER_RESTORED, POD_RESTORED, reconcile_once
from hooks.batchresource.resources import UNLIMITED, CgroupValues

from .fakecgroup import make_cgroup, read, write
from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, container_request, pod_request
from .learnfixtures import MIB, TWO, hook_with_learner, values
from .specs import BE

MAIN, SIDE = f"{POD_PARENT}/c-main", f"{POD_PARENT}/c-side"
MAIN_V1 = ("512", "50000", str(128 * MIB))


async def told_hook(tmp_path: Path, version: int = 1, **containers: str):
    """A hook that answered PreRunPodSandbox and PreCreateContainer for ``containers``
    (id -> name), whose cgroups hold the batch values, and listed them once."""
    root = tmp_path / "cgroup"
    for rel in (POD_PARENT, *(f"{POD_PARENT}/{cid}" for cid in containers)):
        make_cgroup(root, version, rel)
    pod = FakePod("p-1", "uid-1", BE, TWO, containers=dict(containers))
    hook, stub = hook_with_learner(tmp_path, pod, version=version)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    for cid, name in containers.items():  # each answer applied as the runtime does
        res = (await hook.pre_create_container(container_request(BE, TWO, name))).container_resources
        wanted = CgroupValues(res.cpu_shares, res.cpu_quota, res.memory_limit_in_bytes, res.cpu_period)
        apply_values(CgroupFiles(root, version, PurePosixPath(f"{POD_PARENT}/{cid}".lstrip("/"))), wanted)
    assert hook.learner is not None
    await hook.learner.pass_once()
    return hook, stub


def restored(caplog: pytest.LogCaptureFixture, message: str = CONTAINER_RESTORED) -> list[tuple]:
    return [(r.pod, r.container, r.file, r.found, r.wanted) for r in caplog.records if r.getMessage() == message]


@pytest.mark.parametrize("version", [1, 2])
async def test_a_drifted_container_value_is_put_back_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version: int
) -> None:
    hook, _ = await told_hook(tmp_path, version, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    assert reconcile_once(hook.pods) == 0
    if version == 1:
        write(root, 1, MAIN, "cpu.cfs_quota_us", "-1")
        write(root, 1, MAIN, "memory.limit_in_bytes", "9223372036854771712")
    else:
        write(root, 2, MAIN, "cpu.max", "max 100000")
        write(root, 2, MAIN, "memory.max", "max")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 2
    expected = MAIN_V1 if version == 1 else ("20", "50000 100000", str(128 * MIB))
    assert values(root, version, MAIN) == expected
    quota, memory = ("cpu.cfs_quota_us", "memory.limit_in_bytes") if version == 1 else ("cpu.max", "memory.max")
    assert restored(caplog) == [("team-a/batch-job", "main", quota, UNLIMITED, 50000),
                                ("team-a/batch-job", "main", memory, UNLIMITED, 128 * MIB)]
    [line] = [r for r in caplog.records if r.getMessage() == CONTAINER_RESTORED and r.field == "cpu_quota"]
    assert (line.levelno, line.uid, line.container_id) == (logging.INFO, "uid-1", "c-main")
    caplog.clear()
    assert reconcile_once(hook.pods) == 0 and restored(caplog) == []  # put back once, not every pass


async def test_a_drifted_period_names_the_period_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    write(tmp_path / "cgroup", 1, MAIN, "cpu.cfs_period_us", "50000")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert restored(caplog) == [("team-a/batch-job", "main", "cpu.cfs_period_us", 50000, 100000)]
    assert read(tmp_path / "cgroup", 1, MAIN, "cpu.cfs_period_us") == "100000"


@pytest.mark.parametrize("version", [1, 2])
async def test_the_pod_is_raised_before_and_lowered_after_its_containers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, version: int
) -> None:
    hook, _ = await told_hook(tmp_path, version, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    shares = "cpu.shares" if version == 1 else "cpu.weight"
    memory = "memory.limit_in_bytes" if version == 1 else "memory.max"
    write(root, version, POD_PARENT, shares, "2")  # below target: raised first
    write(root, version, POD_PARENT, memory, str(4096 * MIB))  # above: lowered last
    write(root, version, MAIN, shares, "4096" if version == 1 else "500")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 3
    order = [(r.getMessage(), r.field) for r in caplog.records if r.getMessage() in (POD_RESTORED, CONTAINER_RESTORED)]
    assert order == [(POD_RESTORED, "cpu_shares"), (CONTAINER_RESTORED, "cpu_shares"), (POD_RESTORED, "memory_limit")]
    assert values(root, version, POD_PARENT) == (("768", "75000", str(192 * MIB)) if version == 1
                                                 else ("30", "75000 100000", str(192 * MIB)))


async def test_each_owned_file_is_read_once_a_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hook, _ = await told_hook(tmp_path, **{"c-main": "main", "c-side": "side"})
    root = tmp_path / "cgroup"
    write(root, 1, POD_PARENT, "cpu.shares", "2")
    write(root, 1, MAIN, "cpu.cfs_quota_us", "-1")
    reads: list[tuple[str, str]] = []
    original = CgroupFiles._read  # noqa: SLF001

    def counted(self: CgroupFiles, name: str) -> str:
        reads.append((str(self.relative), name))
        return original(self, name)

    monkeypatch.setattr(CgroupFiles, "_read", counted)
    assert reconcile_once(hook.pods) == 2
    assert len(reads) == len(set(reads)) == 3 * 4  # pod and two containers, four files each


async def test_what_the_hook_does_not_own_is_left_alone(tmp_path: Path) -> None:
    """A container made without the hook whose values the listing could not set
    (its memory above its batch limit) is not the hook's; nor is one whose name
    the spec lacks."""
    root = tmp_path / "cgroup"
    for rel in (POD_PARENT, MAIN, SIDE, f"{POD_PARENT}/c-other"):
        make_cgroup(root, 1, rel)
    write(root, 1, SIDE, "memory.usage_in_bytes", str(100 * MIB))  # above side's 64Mi
    pod = FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main", "c-side": "side", "c-other": "other"})
    hook, _ = hook_with_learner(tmp_path, pod)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main"))
    assert hook.learner is not None
    await hook.learner.pass_once()
    assert hook.pods.owned("uid-1") == {"c-main": "main"}
    write(root, 1, SIDE, "cpu.shares", "4096")
    write(root, 1, f"{POD_PARENT}/c-other", "cpu.shares", "4096")
    reconcile_once(hook.pods)
    assert read(root, 1, SIDE, "cpu.shares") == read(root, 1, f"{POD_PARENT}/c-other", "cpu.shares") == "4096"


async def test_a_container_whose_cgroup_is_gone_is_no_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook, _ = await told_hook(tmp_path, **{"c-main": "main", "c-side": "side"})
    root = tmp_path / "cgroup"
    for controller in ("cpu", "memory"):
        shutil.rmtree(root / controller / MAIN.lstrip("/"))
    write(root, 1, SIDE, "cpu.shares", "2")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1  # side put back all the same
    assert read(root, 1, SIDE, "cpu.shares") == "256"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "uid-1" in hook.pods


async def test_an_update_answered_no_change_has_its_cpu_put_back_and_its_memory_retried(tmp_path: Path) -> None:
    """UpdateContainerResources through the proxy, its batch memory limit below
    the usage: the hook answers "no change", the runtime applies kubelet's
    values, and the next pass puts the cpu values back and the memory limit
    once the usage allows (before: the container was left with kubelet's
    values until the hook answered another update)."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, MAIN, "memory.usage_in_bytes", str(200 * MIB))  # above main's 128Mi
    assert await hook.pre_update_container_resources(container_request(BE, TWO, "main", cid="c-main")) is None
    write(root, 1, MAIN, "cpu.shares", "2")  # what kubelet sent, applied by the runtime
    write(root, 1, MAIN, "memory.limit_in_bytes", str(512 * MIB))
    assert reconcile_once(hook.pods) == 1
    assert (read(root, 1, MAIN, "cpu.shares"), read(root, 1, MAIN, "memory.limit_in_bytes")) == ("512", str(512 * MIB))
    write(root, 1, MAIN, "memory.usage_in_bytes", str(10 * MIB))
    assert reconcile_once(hook.pods) == 1
    assert values(root, 1, MAIN) == MAIN_V1


async def test_a_container_memory_limit_below_its_usage_keeps_its_cpu_put_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, MAIN, "memory.limit_in_bytes", str(512 * MIB))
    write(root, 1, MAIN, "memory.usage_in_bytes", str(300 * MIB))
    write(root, 1, MAIN, "cpu.shares", "2")
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert (read(root, 1, MAIN, "cpu.shares"), read(root, 1, MAIN, "memory.limit_in_bytes")) == ("512", str(512 * MIB))
    assert [r.file for r in caplog.records if r.getMessage() == CONTAINER_RESTORED] == ["cpu.shares"]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (warning.container, warning.container_id) == ("main", "c-main") and "below the current usage" in warning.reason


def test_lower_only_writes_only_what_shrinks(tmp_path: Path) -> None:
    make_cgroup(tmp_path, 1, "p")
    files = CgroupFiles(tmp_path, 1, PurePosixPath("p"))
    write(tmp_path, 1, "p", "cpu.shares", "2")
    current = files.read()
    wanted = CgroupValues(cpu_shares=512, cpu_quota=50000, memory_limit=32 * MIB)
    changes = apply_values(files, wanted, lower_only=True, current=current)
    assert [c.field for c in changes] == [Field.CPU_QUOTA, Field.MEMORY_LIMIT]  # shares grow: left to raise_only
    assert read(tmp_path, 1, "p", "cpu.shares") == "2"


async def test_a_stopped_hook_writes_no_cgroup(tmp_path: Path) -> None:
    """Once the hook stopped, the next instance (its socket's lock) writes them."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    write(tmp_path / "cgroup", 1, MAIN, "cpu.shares", "2")
    hook.pods.close()
    assert reconcile_once(hook.pods) == 0
    assert read(tmp_path / "cgroup", 1, MAIN, "cpu.shares") == "2"
