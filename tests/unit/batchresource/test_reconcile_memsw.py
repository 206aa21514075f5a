"""The reconcile pass and cgroup v1's memory+swap limit (with swap accounting):
compared and put back on its own, a container's as the runtime set it from
the swap kubelet asked for (none: equal to its memory limit), a pod's
unlimited (kubelet sets none), written in the order the kernel takes (it
refuses memsw below the memory limit: the fake refuses as it does)."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest

from hooks.batchresource.cgroups import CgroupFiles
from hooks.batchresource.reconcile import CONTAINER_FAILED, CONTAINER_RESTORED, POD_RESTORED, reconcile_once
from hooks.batchresource.resources import UNLIMITED
from hooks.batchresource.server import BatchResourceHook

from .fakecgroup import make_cgroup, read, write
from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, container_request, make_hook, pod_request
from .learnfixtures import MIB, TWO, hook_with_learner
from .specs import BE
from .test_cgroups_memsw import MEMSW, MEMSW_USAGE, NO_LIMIT, kernel_like
from .test_reconcile_containers import MAIN, restored, told_hook

LIMIT = "memory.limit_in_bytes"


async def swap_accounted(tmp_path: Path):
    """A told hook whose cgroups have memsw as the runtime and kubelet leave it:
    the container's equal to its limit, the pod's unlimited."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    for cgroup, memsw in ((MAIN, str(128 * MIB)), (POD_PARENT, NO_LIMIT)):
        write(root, 1, cgroup, MEMSW, memsw)
        write(root, 1, cgroup, MEMSW_USAGE, "0")
    assert reconcile_once(hook.pods) == 0  # (as made: nothing to put back)
    return hook, root


async def test_a_container_memsw_drifted_alone_is_put_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Swap given to a BE container by hand, its memory limit right (before:
    memsw not compared, left at 1Gi)."""
    hook, root = await swap_accounted(tmp_path)
    write(root, 1, MAIN, MEMSW, str(1024 * MIB))
    writes = kernel_like(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert writes == [(MEMSW, str(128 * MIB))]
    assert restored(caplog) == [("team-a/batch-job", "main", MEMSW, 1024 * MIB, 128 * MIB)]
    [line] = [r for r in caplog.records if r.getMessage() == CONTAINER_RESTORED]
    assert line.field == "memory_swap"
    caplog.clear()
    assert reconcile_once(hook.pods) == 0 and restored(caplog) == []


async def test_a_pod_memsw_drifted_alone_is_put_back_unlimited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(before: memsw not compared, left at 256Mi)"""
    hook, root = await swap_accounted(tmp_path)
    write(root, 1, POD_PARENT, MEMSW, str(256 * MIB))
    writes = kernel_like(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert writes == [(MEMSW, str(UNLIMITED))]
    assert [(r.field, r.file, r.found, r.wanted) for r in caplog.records if r.getMessage() == POD_RESTORED] == [
        ("memory_swap", MEMSW, 256 * MIB, UNLIMITED)]
    assert read(root, 1, POD_PARENT, LIMIT) == str(192 * MIB)


@pytest.mark.parametrize(("memory", "memsw", "order"), [
    (96, 96, [MEMSW, LIMIT]),  # raising: memsw first (a crictl update to 96Mi leaves both)
    (256, 512, [LIMIT, MEMSW]),  # lowering: the limit first
    (256, 256, [LIMIT, MEMSW]),
])
async def test_a_container_limit_and_memsw_drifted_together_are_put_back_in_the_kernels_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: int, memsw: int, order: list[str]
) -> None:
    """(before: a memsw above the limit left alone, so a lowered limit left memsw
    at 512Mi; the tied cases guard existing behaviour)"""
    hook, root = await swap_accounted(tmp_path)
    write(root, 1, MAIN, MEMSW, str(max(memsw, memory) * MIB))  # (memsw first, as the kernel takes)
    write(root, 1, MAIN, LIMIT, str(memory * MIB))
    write(root, 1, MAIN, MEMSW, str(memsw * MIB))
    writes = kernel_like(monkeypatch)
    reconcile_once(hook.pods)
    assert [name for name, _ in writes] == order
    assert (read(root, 1, MAIN, LIMIT), read(root, 1, MAIN, MEMSW)) == (str(128 * MIB), str(128 * MIB))


async def test_memsw_lowered_while_the_limit_rises_goes_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64Mi/1Gi put back to 128Mi/128Mi: memsw first (at or above the current
    limit), then the limit. Guards the order (passes before this change too)."""
    hook, root = await swap_accounted(tmp_path)
    write(root, 1, MAIN, MEMSW, str(1024 * MIB))
    write(root, 1, MAIN, LIMIT, str(64 * MIB))
    writes = kernel_like(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 2
    assert writes == [(MEMSW, str(128 * MIB)), (LIMIT, str(128 * MIB))]


async def test_memsw_not_lowered_below_its_usage_the_limit_raised_all_the_same(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64Mi/1Gi, 300Mi of memory+swap in use: memsw is not lowered to 128Mi
    (the kernel would reclaim, then refuse it EBUSY, every pass); the limit's
    raise to 128Mi still lands, logged (before: memsw written first, refused,
    and the limit never raised)."""
    hook, root = await swap_accounted(tmp_path)
    write(root, 1, MAIN, MEMSW, str(1024 * MIB))
    write(root, 1, MAIN, LIMIT, str(64 * MIB))
    write(root, 1, MAIN, MEMSW_USAGE, str(300 * MIB))
    writes = kernel_like(monkeypatch)
    real = CgroupFiles._write  # noqa: SLF001

    def busy(files: CgroupFiles, name: str, value: str) -> None:  # as the kernel: EBUSY below the usage
        if name == MEMSW and int(value) < 300 * MIB:
            raise OSError(errno.EBUSY, "Device or resource busy")
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", busy)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert writes == [(LIMIT, str(128 * MIB))]
    assert (read(root, 1, MAIN, LIMIT), read(root, 1, MAIN, MEMSW)) == (str(128 * MIB), str(1024 * MIB))
    assert restored(caplog) == [("team-a/batch-job", "main", LIMIT, 64 * MIB, 128 * MIB)]
    [failed] = [r for r in caplog.records if r.getMessage() == CONTAINER_FAILED]
    assert "memory+swap limit" in failed.reason


async def test_memsw_written_then_the_limit_refused_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """96Mi/96Mi put back to 128Mi: memsw raised first, then the limit's write
    refused: the memsw that landed is logged and counted (before: left out)."""
    hook, root = await swap_accounted(tmp_path)
    write(root, 1, MAIN, LIMIT, str(96 * MIB))
    write(root, 1, MAIN, MEMSW, str(96 * MIB))
    real = CgroupFiles._write  # noqa: SLF001

    def refused(files: CgroupFiles, name: str, value: str) -> None:
        if name == LIMIT and str(files.relative) == MAIN.lstrip("/"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", refused)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert restored(caplog) == [("team-a/batch-job", "main", MEMSW, 96 * MIB, 128 * MIB)]


async def test_swap_kubelet_asked_for_is_kept_and_put_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kubelet's UnlimitedSwap (NodeSwap on v1) asks memory_swap_limit_in_bytes
    -1: the runtime sets memsw unlimited, and the pass keeps it so, putting
    back a memsw lowered by hand (before: lowered to the limit, taking the swap
    kubelet asked for)."""
    hook, root = await swap_accounted(tmp_path)
    update = container_request(BE, TWO, "main", cid="c-main", memory_swap_limit_in_bytes=UNLIMITED)
    assert await hook.pre_update_container_resources(update) is not None
    write(root, 1, MAIN, MEMSW, NO_LIMIT)  # as the runtime applies the answer
    assert reconcile_once(hook.pods) == 0
    write(root, 1, MAIN, MEMSW, str(256 * MIB))
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(hook.pods) == 1
    assert restored(caplog) == [("team-a/batch-job", "main", MEMSW, 256 * MIB, UNLIMITED)]


async def restarted(tmp_path: Path) -> BatchResourceHook:
    """A new hook object on the same state dir, as its start reads it, listed
    once (which tells the reconcile pass the container's id)."""
    hook, _ = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"}))
    await hook.pods.load()
    return hook


@pytest.mark.parametrize(("ask", "wanted"), [(None, 128 * MIB), (UNLIMITED, UNLIMITED)])
async def test_a_restarted_hook_puts_memsw_back_from_the_swap_ask_in_its_state_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, ask: int | None, wanted: int
) -> None:
    """kubelet's ask (none at the create: memsw at the limit; or -1 at an
    update: unlimited) is saved with the pod: a new hook object reading the
    state dir puts back a memsw drifted from it (before: the ask was kept in
    memory only, so after a restart a memsw raised to 1Gi stayed so, until
    kubelet created or updated the container again)."""
    hook, root = await swap_accounted(tmp_path)
    if ask is not None:
        update = container_request(BE, TWO, "main", cid="c-main", memory_swap_limit_in_bytes=ask)
        assert await hook.pre_update_container_resources(update) is not None
        write(root, 1, MAIN, MEMSW, str(ask))  # as the runtime applies the answer
        assert hook.learner is not None
        await hook.learner.pass_once()  # (its flush saves the ask)
    saved = json.loads((tmp_path / "state" / "uid-1.json").read_text())
    assert saved["swap"] == {"main": 0 if ask is None else ask}
    again = await restarted(tmp_path)
    assert again.learner is not None
    await again.learner.pass_once()
    assert reconcile_once(again.pods) == 0  # (as the runtime left it)
    drifted = 256 * MIB if wanted == UNLIMITED else 1024 * MIB
    write(root, 1, MAIN, MEMSW, str(drifted))
    writes = kernel_like(monkeypatch)
    caplog.set_level(logging.INFO, "hooks.batchresource")
    assert reconcile_once(again.pods) == 1
    assert writes == [(MEMSW, str(wanted))]
    assert restored(caplog) == [("team-a/batch-job", "main", MEMSW, drifted, wanted)]


async def test_a_changed_swap_ask_is_saved_before_the_answer(tmp_path: Path) -> None:
    """kubelet asked none at the create (saved by a pass), then -1 at an
    update, and the hook crashed before its next pass: the update's answer
    waited for the new ask's save, so the restarted hook keeps memsw
    unlimited (before: saved at the next pass only, so the file held the
    older ask, which the restarted hook put back, lowering memsw to the
    memory limit: the swap kubelet asked for taken away)."""
    hook, root = await swap_accounted(tmp_path)
    assert json.loads((tmp_path / "state" / "uid-1.json").read_text())["swap"] == {"main": 0}
    update = container_request(BE, TWO, "main", cid="c-main", memory_swap_limit_in_bytes=UNLIMITED)
    assert await hook.pre_update_container_resources(update) is not None
    write(root, 1, MAIN, MEMSW, NO_LIMIT)  # as the runtime applies the answer; then the crash: no pass
    assert json.loads((tmp_path / "state" / "uid-1.json").read_text())["swap"] == {"main": UNLIMITED}
    again = await restarted(tmp_path)
    assert again.learner is not None
    await again.learner.pass_once()
    assert reconcile_once(again.pods) == 0
    assert read(root, 1, MAIN, MEMSW) == NO_LIMIT


async def test_a_container_whose_swap_ask_is_not_known_keeps_its_memsw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart from a state file with no swap ask (an older
    version's): memsw is not lowered (it may be swap kubelet asked for),
    only raised with a limit put back above it. Guards existing behaviour
    for such files."""
    _, root = await swap_accounted(tmp_path)
    path = tmp_path / "state" / "uid-1.json"
    old = json.loads(path.read_text())
    del old["swap"]
    path.write_text(json.dumps(old))
    hook, _ = hook_with_learner(tmp_path, FakePod("p-1", "uid-1", BE, TWO, containers={"c-main": "main"}))
    await hook.pods.load()
    assert hook.learner is not None
    await hook.learner.pass_once()
    write(root, 1, MAIN, MEMSW, str(1024 * MIB))
    assert reconcile_once(hook.pods) == 0
    assert read(root, 1, MAIN, MEMSW) == str(1024 * MIB)
    write(root, 1, MAIN, LIMIT, str(96 * MIB))
    write(root, 1, MAIN, MEMSW, str(96 * MIB))
    writes = kernel_like(monkeypatch)
    assert reconcile_once(hook.pods) == 1
    assert writes == [(MEMSW, str(128 * MIB)), (LIMIT, str(128 * MIB))]


async def test_the_pod_write_at_pre_run_pod_sandbox_sets_memsw_unlimited_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod cgroup at 64Mi/64Mi raised to 192Mi: memsw to -1 first, then the
    limit (the kernel refuses a limit above memsw). Guards existing behaviour."""
    hook = make_hook(tmp_path)
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    for name, value in ((MEMSW, str(64 * MIB)), (MEMSW_USAGE, "0"), (LIMIT, str(64 * MIB))):
        write(root, 1, POD_PARENT, name, value)
    writes = kernel_like(monkeypatch)
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    assert [w for w in writes if w[0] in (LIMIT, MEMSW)] == [(MEMSW, str(UNLIMITED)), (LIMIT, str(192 * MIB))]
