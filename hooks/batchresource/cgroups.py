"""Where a pod's or a container's cgroup is, and its cpu/memory files on cgroup v1 and v2."""

from __future__ import annotations

import enum
import errno
import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .resources import CFS_PERIOD, UNLIMITED, CgroupValues

__all__ = [
    "PAGE_SIZE",
    "CgroupDriver",
    "CgroupFiles",
    "Field",
    "MemoryBelowUsage",
    "container_relative_path",
    "detect_version",
    "page_floor",
    "parent_relative_path",
    "rank",
    "shares_to_weight",
    "weight_to_shares",
]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# A v1 memory limit at or above this reads back as "no limit" (the kernel shows PAGE_COUNTER_MAX pages).
_V1_UNLIMITED_FLOOR = 2**62
# v1's memory+swap limit (with swap accounting): the kernel refuses
# (EINVAL) a memory.limit_in_bytes above it.
_V1_MEMSW = "memory.memsw.limit_in_bytes"


class MemoryBelowUsage(ValueError):
    """The wanted memory limit (or v1 memory+swap limit) is below what the
    cgroup uses now: the kernel would reclaim, then refuse (EBUSY)."""


class CgroupDriver(enum.Enum):
    AUTO = "auto"
    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


class Field(enum.Enum):
    """The pod/container values the hook manages, in the order they are written."""

    CPU_SHARES = "cpu_shares"
    CPU_QUOTA = "cpu_quota"
    MEMORY_LIMIT = "memory_limit"
    MEMORY_SWAP = "memory_swap"  # v1 with swap accounting only, and only when wanted


def detect_version(root: Path) -> int:
    """2 on a unified hierarchy (``cgroup.controllers`` at the root), else 1."""
    return 2 if (root / "cgroup.controllers").is_file() else 1


def _systemd_slice_path(name: str) -> PurePosixPath:
    """``a-b-c.slice`` -> ``a.slice/a-b.slice/a-b-c.slice`` (systemd's slice nesting)."""
    if not name.endswith(".slice"):
        raise ValueError(f"{name!r} is not a systemd slice name")
    stem = name[: -len(".slice")]
    if not stem or stem == "-":
        return PurePosixPath()
    parts = stem.split("-")
    if any(not p for p in parts):
        raise ValueError(f"{name!r}: empty part in slice name")
    return PurePosixPath(*("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))))


def resolve_driver(cgroup_parent: str, driver: CgroupDriver) -> CgroupDriver:
    if driver is not CgroupDriver.AUTO:
        return driver
    last = cgroup_parent.rstrip("/").rsplit("/", 1)[-1]
    return CgroupDriver.SYSTEMD if last.endswith(".slice") else CgroupDriver.CGROUPFS


def parent_relative_path(cgroup_parent: str, driver: CgroupDriver) -> PurePosixPath:
    """The pod cgroup below a hierarchy's root, as kubelet created it."""
    if not cgroup_parent:
        raise ValueError("the pod has no cgroup_parent")
    driver = resolve_driver(cgroup_parent, driver)
    if driver is CgroupDriver.SYSTEMD and "/" not in cgroup_parent.strip("/"):
        path = _systemd_slice_path(cgroup_parent.strip("/"))
    else:
        path = PurePosixPath(cgroup_parent.lstrip("/"))
    if ".." in path.parts:
        raise ValueError(f"cgroup_parent {cgroup_parent!r} leaves the cgroup tree")
    return path


def container_relative_path(cgroup_parent: str, container_id: str, driver: CgroupDriver) -> PurePosixPath:
    """Where containerd puts a container: ``<parent>/<id>`` (cgroupfs) or
    ``<parent slice>/cri-containerd-<id>.scope`` (systemd)."""
    parent = parent_relative_path(cgroup_parent, driver)
    if resolve_driver(cgroup_parent, driver) is CgroupDriver.SYSTEMD:
        return parent / f"cri-containerd-{container_id}.scope"
    return parent / container_id


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu.shares [2, 262144] -> v2 cpu.weight [1, 10000] (runc's conversion)."""
    shares = min(max(shares, 2), 262144)
    return 1 + ((shares - 2) * 9999) // 262142


def weight_to_shares(weight: int) -> int:
    """The inverse, rounded up so that shares_to_weight(weight_to_shares(w)) == w."""
    weight = min(max(weight, 1), 10000)
    return 2 + -(-((weight - 1) * 262142) // 9999)


def page_floor(value: int) -> int:
    return value if value == UNLIMITED else value // PAGE_SIZE * PAGE_SIZE


def rank(value: int) -> float:
    """A value to compare limits by: unlimited (-1) is the most."""
    return math.inf if value == UNLIMITED else value


@dataclass(frozen=True)
class CgroupFiles:
    """A cgroup's cpu and memory files under ``root`` (v1: ``root/cpu/...``, ``root/memory/...``)."""

    root: Path
    version: int
    relative: PurePosixPath

    def _dir(self, controller: str) -> Path:
        return self.root / self.relative if self.version == 2 else self.root / controller / self.relative

    def exists(self) -> bool:
        return self._dir("cpu").is_dir() and self._dir("memory").is_dir()

    def file(self, name: str) -> Path:
        return self._dir(name.split(".", 1)[0]) / name

    def file_names(self) -> dict[Field, tuple[str, ...]]:
        if self.version == 2:
            return {Field.CPU_SHARES: ("cpu.weight",), Field.CPU_QUOTA: ("cpu.max",), Field.MEMORY_LIMIT: ("memory.max",)}
        return {
            Field.CPU_SHARES: ("cpu.shares",),
            Field.CPU_QUOTA: ("cpu.cfs_period_us", "cpu.cfs_quota_us"),
            Field.MEMORY_LIMIT: ("memory.limit_in_bytes",),
            Field.MEMORY_SWAP: (_V1_MEMSW,),
        }

    def _read(self, name: str) -> str:
        return self.file(name).read_text().strip()

    def read(self) -> CgroupValues:
        if self.version == 2:
            quota_text, _, period = self._read("cpu.max").partition(" ")
            memory = self._read("memory.max")
            return CgroupValues(
                cpu_shares=weight_to_shares(int(self._read("cpu.weight"))),
                cpu_quota=UNLIMITED if quota_text == "max" else int(quota_text),
                memory_limit=UNLIMITED if memory == "max" else int(memory),
                cpu_period=int(period or CFS_PERIOD),
            )
        return CgroupValues(
            cpu_shares=int(self._read("cpu.shares")),
            cpu_quota=int(self._read("cpu.cfs_quota_us")),
            memory_limit=self._v1_limit("memory.limit_in_bytes"),
            cpu_period=int(self._read("cpu.cfs_period_us")),
            memory_swap=self._v1_limit(_V1_MEMSW) if self.file(_V1_MEMSW).is_file() else None,
        )

    def memory_usage(self) -> int:
        return int(self._read("memory.current" if self.version == 2 else "memory.usage_in_bytes"))

    def differs(self, current: CgroupValues, wanted: CgroupValues, field: Field) -> bool:
        """Whether ``field`` needs a write (compared as the kernel stores it)."""
        if field is Field.CPU_SHARES:
            if self.version == 2:
                return shares_to_weight(current.cpu_shares) != shares_to_weight(wanted.cpu_shares)
            return current.cpu_shares != wanted.cpu_shares
        if field is Field.CPU_QUOTA:
            periods_matter = wanted.cpu_quota != UNLIMITED
            return current.cpu_quota != wanted.cpu_quota or (periods_matter and current.cpu_period != wanted.cpu_period)
        if field is Field.MEMORY_SWAP:  # (None: v2, no swap accounting, or not managed)
            return (wanted.memory_swap is not None and current.memory_swap is not None
                    and current.memory_swap != page_floor(wanted.memory_swap))
        return current.memory_limit != page_floor(wanted.memory_limit)

    def changed(self, current: CgroupValues, wanted: CgroupValues, field: Field) -> tuple[str, int, int]:
        """For a field that :meth:`differs`: the file that does and its found and
        wanted values, in the hook's units (shares, quota, bytes; -1 unlimited),
        the period's when only the period differs."""
        names = self.file_names()[field]
        if field is Field.CPU_QUOTA and current.cpu_quota == wanted.cpu_quota:
            return names[0], current.cpu_period, wanted.cpu_period
        return names[-1], getattr(current, field.value), getattr(wanted, field.value)

    def write(self, field: Field, wanted: CgroupValues) -> None:
        if self.version == 2:
            if field is Field.CPU_SHARES:
                self._write("cpu.weight", str(shares_to_weight(wanted.cpu_shares)))
            elif field is Field.CPU_QUOTA:
                quota = "max" if wanted.cpu_quota == UNLIMITED else str(wanted.cpu_quota)
                self._write("cpu.max", f"{quota} {wanted.cpu_period}")
            elif field is Field.MEMORY_LIMIT:
                self._write("memory.max", "max" if wanted.memory_limit == UNLIMITED else str(wanted.memory_limit))
            return
        if field is Field.CPU_SHARES:
            self._write("cpu.shares", str(wanted.cpu_shares))
        elif field is Field.CPU_QUOTA:
            self._write_v1_cfs(wanted.cpu_quota, wanted.cpu_period)
        elif field is Field.MEMORY_LIMIT:
            self._write_v1_memory(wanted.memory_limit, wanted.memory_swap)
        elif (wanted.memory_swap is not None and self.file(_V1_MEMSW).is_file()
              and (found := self._v1_limit(_V1_MEMSW)) != page_floor(wanted.memory_swap)):
            # memsw alone (the limit's write above puts it right along with a limit that differed):
            # a lowered memsw is never below the limit then, put right first (Field's order)
            self._write_memsw(wanted.memory_swap, found)

    def _write_v1_cfs(self, quota: int, period: int) -> None:
        """cpu.cfs_period_us and cpu.cfs_quota_us in an order the kernel takes
        (runc's). Each write is checked with the other file as it is: v1
        refuses (EINVAL) a quota per period above a limited parent's or below
        a limited child's. The period first: a shorter one under the old quota
        can be refused under a limited parent (then the quota, lowered per
        period, goes first), a longer one can be refused above a limited child
        (then the quota, raised per period, goes first); a quota first would
        be refused in the opposite cases. With a bound on one side only (a
        container under its pod, a pod under kubelet's unlimited QoS cgroup)
        one of the two orders is taken. An unlimited quota is written alone:
        the kernel checks no period against it."""
        if quota == UNLIMITED:
            self._write("cpu.cfs_quota_us", str(quota))
            return
        try:
            self._write("cpu.cfs_period_us", str(period))
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._write("cpu.cfs_quota_us", str(quota))
            self._write("cpu.cfs_period_us", str(period))
            return
        self._write("cpu.cfs_quota_us", str(quota))

    def _v1_limit(self, name: str) -> int:
        value = int(self._read(name))
        return UNLIMITED if value >= _V1_UNLIMITED_FLOOR else value

    def _write_memsw(self, memsw: int, found: int) -> None:
        self._check_memsw(memsw, found)
        self._write(_V1_MEMSW, str(memsw))

    def _check_memsw(self, memsw: int, found: int) -> None:
        """Raises MemoryBelowUsage for a memsw lowered below its usage (memory
        plus swap): the kernel would reclaim page cache, then refuse it
        (EBUSY), every pass."""
        if rank(page_floor(memsw)) < rank(found):
            usage = int(self._read("memory.memsw.usage_in_bytes"))
            if memsw < usage:
                raise MemoryBelowUsage(f"memory+swap limit {memsw} is below the current usage {usage}")

    def _write_v1_memory(self, limit: int, memsw: int | None) -> None:
        """memory.limit_in_bytes, with memory.memsw.limit_in_bytes (when swap is
        accounted) in an order the kernel takes: it refuses a memory limit
        above memsw, and memsw below the limit.

        ``memsw`` None (a write as the runtime's own, for a container whose
        swap the hook was not told): memsw raised first to a new limit above
        it, and lowered after the limit when the two were equal (no swap, as
        containerd makes a container it is not asked swap for); otherwise
        left as it is (swap given to it is kept).

        ``memsw`` wanted (the reconcile pass's, KnownPods.wanted): both put
        at their values, each file only when it differs: memsw first when it
        is at or above the current limit, else the limit first (runc's order,
        but for memsw equal to the current limit, which runc writes second).

        Raises MemoryBelowUsage for a memsw lowered below its usage: the limit
        is still written if the kernel takes it with memsw as it is."""
        if not self.file(_V1_MEMSW).is_file():  # (no swap accounting: swapaccount=0)
            self._write("memory.limit_in_bytes", str(limit))
            return
        if memsw is not None:
            self._write_v1_memory_and_swap(limit, memsw)
            return
        old, memsw = self._v1_limit("memory.limit_in_bytes"), self._v1_limit(_V1_MEMSW)
        if rank(limit) > rank(memsw):
            self._write(_V1_MEMSW, str(limit))
            self._write("memory.limit_in_bytes", str(limit))
            return
        self._write("memory.limit_in_bytes", str(limit))
        if memsw == old and rank(limit) < rank(memsw):  # tied as containerd made it: kept tied
            self._write_memsw(limit, memsw)

    def _write_v1_memory_and_swap(self, limit: int, memsw: int) -> None:
        old, old_memsw = self._v1_limit("memory.limit_in_bytes"), self._v1_limit(_V1_MEMSW)
        limit_differs, memsw_differs = old != page_floor(limit), old_memsw != page_floor(memsw)
        if memsw_differs:
            try:
                self._check_memsw(memsw, old_memsw)
            except MemoryBelowUsage:
                # memsw stays: the limit still goes in when memsw as it is takes it
                # (a raise to 128Mi under a 1Gi memsw), as a limit written alone would
                if limit_differs and rank(limit) <= rank(old_memsw):
                    self._write("memory.limit_in_bytes", str(limit))
                raise
        writes = [("memory.limit_in_bytes", limit, limit_differs), (_V1_MEMSW, memsw, memsw_differs)]
        if rank(memsw) >= rank(old):
            writes.reverse()
        for name, value, differs in writes:
            if differs:
                self._write(name, str(value))

    def _write(self, name: str, value: str) -> None:
        # Plain write, no truncation games: cgroup files take one value per write().
        with open(self.file(name), "w") as f:
            f.write(value)
