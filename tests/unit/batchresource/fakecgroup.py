"""A cgroup tree of plain files under a temp dir, shaped like /sys/fs/cgroup (v1 or v2)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

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
