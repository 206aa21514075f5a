"""kubelet's private cgroupRoot: made in every hierarchy before kubelet starts, removed after.

kubelet (cgroupfs driver) wants its `cgroupRoot` to exist in every mounted
hierarchy and builds its `kubepods` tree below it; runc also makes the
containers' paths in the unified hierarchy of a hybrid host. A root of our
own keeps all of that apart from the machine's other cgroups, and removing
the whole tree afterwards leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..integration.batchhelpers import hierarchies

_RMDIR_ATTEMPTS = 50
_RMDIR_RETRY = 0.1


def read_value(path: Path) -> int:
    return int(path.read_text().split()[0])


def cgroup_of(pid: int, controller: str) -> str:
    """The cgroup path (from the hierarchy's root) of `pid` in the v1 hierarchy of `controller`."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise LookupError(f"pid {pid} has no {controller} cgroup")


@dataclass
class CgroupRoot:
    """`/<name>` in every hierarchy; `path(controller, *parts)` finds what kubelet made below it."""

    name: str = field(default_factory=lambda: f"rp-node-{uuid.uuid4().hex[:8]}")
    created: list[Path] = field(default_factory=list)

    @property
    def parent(self) -> str:
        """As kubelet's `cgroupRoot` setting."""
        return f"/{self.name}"

    def path(self, controller: str, cgroup: str = "") -> Path:
        """The directory of `cgroup` (a path from the hierarchy's root) in the hierarchy of `controller`."""
        for hierarchy in hierarchies():
            if controller in hierarchy.name.split(","):
                return hierarchy / cgroup.lstrip("/")
        raise LookupError(f"no cgroup hierarchy for {controller}")

    def make(self) -> None:
        for hierarchy in hierarchies():
            directory = hierarchy / self.name
            directory.mkdir()
            self.created.append(directory)
            if (directory / "cpuset.cpus").exists():  # a cpuset cgroup takes no task until these are set
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (directory / name).write_text((hierarchy / name).read_text())

    async def remove(self) -> list[str]:
        """Remove the whole tree in every hierarchy, deepest first; the directories that would not go.

        A cgroup whose last task is still exiting is busy for a moment, so
        each directory gets a few bounded retries.
        """
        left = []
        for top in self.created:
            for directory in _deepest_first(top):
                if not await _rmdir(directory):
                    left.append(str(directory))
        self.created.clear()
        return left


def _deepest_first(top: Path) -> list[Path]:
    if not top.is_dir():
        return []
    found = [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


async def _rmdir(directory: Path) -> bool:
    for _ in range(_RMDIR_ATTEMPTS):
        try:
            os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                return False
        await asyncio.sleep(_RMDIR_RETRY)
    return False
