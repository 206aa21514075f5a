"""A fake /sys (and /proc) tree for the node facts the proxy reads, and a cgroup v1 cpuset hierarchy; tests change it between calls."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

from runtimeproxy.hookpath.parentcpuset import ParentCpusets


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


CPUSET_MOUNT = "sys/fs/cgroup/cpuset"


def cgroup_v1_cpuset(root: Path, cgroups: dict[str, tuple[str, str]], *, options: str = "rw,cpuset") -> Path:
    """A cgroup v1 cpuset hierarchy mounted at /sys/fs/cgroup/cpuset, as
    /proc/self/mountinfo shows it (super options ``options``), holding
    ``cgroups``: path -> (cpuset.cpus, cpuset.mems), "/" the root's."""
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/self/mountinfo").write_text(
        "22 1 0:21 / / rw,relatime - ext4 /dev/vda1 rw\n"
        "31 22 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        f"34 31 0:31 / /{CPUSET_MOUNT} rw,relatime - cgroup cgroup {options}\n"
    )
    for path, (cpus, mems) in cgroups.items():
        set_cgroup_cpuset(root, path, cpus, mems)
    return root / CPUSET_MOUNT


def set_cgroup_cpuset(root: Path, path: str, cpus: str, mems: str) -> None:
    """Make (or change) a cgroup of the fake v1 cpuset hierarchy, as kubelet or an operator would."""
    directory = root / CPUSET_MOUNT / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cpuset.cpus").write_text(f"{cpus}\n")
    (directory / "cpuset.mems").write_text(f"{mems}\n")


def parent_cpusets_of(root: Path) -> SimpleNamespace:
    """A stand-in for ``ParentCpusets`` where the proxy's modules look it up
    (monkeypatch ``runtimeproxy.app.ParentCpusets``): its ``of_host()`` reads
    the fake tree ``root``, judging nothing where that has no v1 cpuset mount."""
    return SimpleNamespace(of_host=functools.partial(ParentCpusets.of_host, root))
