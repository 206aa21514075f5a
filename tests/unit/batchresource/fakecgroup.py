"""A cgroup tree of plain files under a temp dir, shaped like /sys/fs/cgroup (v1 or v2)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from hooks.batchresource.cgroups import CgroupFiles

V1_FILES = {
    "cpu": {"cpu.shares": "1024", "cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"},
    "memory": {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "0"},
}
V2_FILES = {"cpu.weight": "100", "cpu.max": "max 100000", "memory.max": "max", "memory.current": "0"}


def make_cgroup(root: Path, version: int, relative: str | PurePosixPath) -> None:
    relative = str(relative).lstrip("/")
    if version == 2:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").touch()
        directory = root / relative
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in V2_FILES.items():
            (directory / name).write_text(value + "\n")
        return
    for controller, files in V1_FILES.items():
        directory = root / controller / relative
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (directory / name).write_text(value + "\n")


def read(root: Path, version: int, relative: str, name: str) -> str:
    relative = relative.lstrip("/")
    base = root if version == 2 else root / name.split(".", 1)[0]
    return (base / relative / name).read_text().strip()


def write(root: Path, version: int, relative: str, name: str, value: str) -> None:
    relative = relative.lstrip("/")
    base = root if version == 2 else root / name.split(".", 1)[0]
    (base / relative / name).write_text(value)


QUOTA, PERIOD = "cpu.cfs_quota_us", "cpu.cfs_period_us"
_BW_SHIFT = 20  # the kernel's to_ratio() fixed point


def _bandwidth(quota: int, period: int) -> int | None:
    """A v1 quota per period as the kernel compares it (to_ratio); None: unlimited."""
    return None if quota < 0 else (quota << _BW_SHIFT) // period


def _own(directory: Path) -> int | None:
    quota = directory / QUOTA
    if not quota.is_file():  # (the hierarchy's root: no quota)
        return None
    return _bandwidth(int(quota.read_text()), int((directory / PERIOD).read_text()))


def cfs_schedulable(cpu_root: Path, group: Path, quota: int, period: int) -> bool:
    """The kernel's v1 check (tg_cfs_schedulable_down) of ``group`` set to
    quota/period: a limited group's quota per period is at most its nearest
    limited ancestor's, for ``group`` and every group below it; an unlimited
    group inherits its parent's bound. (Groups elsewhere are not checked: a
    tree the kernel made is valid there already.)"""
    bound: int | None = None
    relative = group.relative_to(cpu_root)
    for ancestor in reversed(relative.parents):  # root first; (cpu_root itself has no quota)
        own = _own(cpu_root / ancestor)
        bound = bound if own is None else own

    def fits(directory: Path, own: int | None, bound: int | None) -> bool:
        if own is None:
            own = bound
        elif bound is not None and own > bound:
            return False
        return all(fits(child, _own(child), own) for child in directory.iterdir() if (child / QUOTA).is_file())

    return fits(group, _bandwidth(quota, period), bound)


def kernel_like_cfs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """CgroupFiles._write (v1) refusing (EINVAL) a cpu.cfs_quota_us or
    cpu.cfs_period_us that, with the other file as it is, breaks the kernel's
    rule (cfs_schedulable); the writes made, in order, as (cgroup, file, value)."""
    writes: list[tuple[str, str, str]] = []
    real: Callable[[CgroupFiles, str, str], None] = CgroupFiles._write  # noqa: SLF001

    def checked(files: CgroupFiles, name: str, value: str) -> None:
        if files.version == 1 and name in (QUOTA, PERIOD):
            directory = files.file(name).parent
            quota = int(value if name == QUOTA else (directory / QUOTA).read_text())
            period = int(value if name == PERIOD else (directory / PERIOD).read_text())
            if not cfs_schedulable(files.root / "cpu", directory, quota, period):
                raise OSError(errno.EINVAL, "Invalid argument")
        writes.append((str(files.relative), name, value))
        real(files, name, value)

    monkeypatch.setattr(CgroupFiles, "_write", checked)
    return writes
