"""A fake /sys (and /proc) tree for the node facts the proxy reads; tests change it between calls."""

from __future__ import annotations

from pathlib import Path


def fake_root(tmp_path: Path, *, cpus: str, nodes: str | None) -> Path:
    """Online CPUs ``cpus``; online NUMA nodes ``nodes`` (None: no NUMA, no node directory)."""
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text(cpus)
    if nodes is not None:
        (tmp_path / "sys/devices/system/node").mkdir(parents=True)
        (tmp_path / "sys/devices/system/node/online").write_text(nodes)
    return tmp_path


def set_online_cpus(root: Path, cpus: str) -> None:
    """CPU hotplug, as sysfs shows it."""
    (root / "sys/devices/system/cpu/online").write_text(cpus)


def set_nodes_with_memory(root: Path, nodes: str) -> None:
    """Memory hotplug (a node gained or lost its memory), as sysfs shows it."""
    (root / "sys/devices/system/node/has_memory").write_text(nodes)


def on_cgroup_v2(root: Path, kernel: str) -> None:
    """The cpuset controller on the unified hierarchy, under kernel release ``kernel``."""
    (root / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/osrelease").write_text(kernel)
