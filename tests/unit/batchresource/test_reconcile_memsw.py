"""The reconcile pass and cgroup v1's memory+swap limit (with swap accounting):
compared and put back on its own, a container's equal to its memory limit
(as containerd makes it), a pod's unlimited (kubelet sets none), written in
the order the kernel takes (it refuses memsw below the memory limit: the
fake refuses as it does)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hooks.batchresource.reconcile import CONTAINER_RESTORED, POD_RESTORED, reconcile_once
from hooks.batchresource.resources import UNLIMITED

from .fakecgroup import read, write
from .hookfixtures import POD_PARENT
from .learnfixtures import MIB
from .test_cgroups_memsw import MEMSW, NO_LIMIT, kernel_like
from .test_reconcile_containers import MAIN, restored, told_hook

LIMIT = "memory.limit_in_bytes"


async def swap_accounted(tmp_path: Path):
    """A told hook whose cgroups have memsw as the runtime and kubelet leave it:
    the container's equal to its limit, the pod's unlimited."""
    hook, _ = await told_hook(tmp_path, **{"c-main": "main"})
    root = tmp_path / "cgroup"
    write(root, 1, MAIN, MEMSW, str(128 * MIB))
    write(root, 1, POD_PARENT, MEMSW, NO_LIMIT)
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
