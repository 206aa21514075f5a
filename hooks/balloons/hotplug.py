"""Noticing CPU and memory hotplug.

The topology is read from sysfs once; a CPU taken offline (or brought
online), or a node losing or gaining memory, changes what balloons may use.
The online CPUs and the nodes with memory are small files, read again at
every reconcile pass, every PreCreateContainer and before moving running
containers; when they differ from what was last acted on, the whole
topology is read again for the hook to re-plan its balloons
(:meth:`~.sync.RuntimeSync._follow_hotplug`). A sysfs that cannot be read
is warned once per distinct failure.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .topology import Online, Topology, TopologyError, format_cpuset, read_online

log = logging.getLogger("hooks.balloons")


class HotplugWatch:
    def __init__(self, sysfs_root: str | os.PathLike[str], topology: Topology) -> None:
        self.root = Path(sysfs_root)
        self._seen: Online = topology.online  # what was last acted on
        # The last failure, warned once: the online CPUs and memory nodes read
        # (None: unreadable) and why. Not retried for the same input but by
        # a reconcile pass (``retry``).
        self._failed: tuple[Online | None, str] | None = None

    def changed(self, retry: bool = False) -> Topology | None:
        """The topology read again if the online CPUs or memory nodes changed
        since the last call that returned one; None otherwise, and when sysfs
        cannot be read. A failure is warned once; the full read (tens of ms on
        large machines) is not taken again for the same online CPUs and memory
        nodes, except with ``retry`` (reconcile passes: a failure halfway
        through a change may heal with nothing more changing)."""
        try:
            online = read_online(self.root)
        except TopologyError as exc:
            self._failure(None, exc)
            return None
        if online == self._seen:
            self._failed = None
            return None
        if not retry and self._failed is not None and self._failed[0] == online:
            return None
        try:
            topology = Topology.from_sysfs(self.root)
        except TopologyError as exc:
            self._failure(online, exc)
            return None
        self._failed = None
        now = topology.online
        log.warning(
            "CPU topology changed (hotplug): %s, was %s",
            now.describe(), self._seen.describe(),
            extra={"online_cpus": format_cpuset(now.cpus), "previous_online_cpus": format_cpuset(self._seen.cpus)},
        )
        self._seen = now
        return topology

    def _failure(self, online: Online | None, exc: TopologyError) -> None:
        failed = (online, str(exc))
        if failed != self._failed:
            log.warning("cannot read the CPU topology to check for hotplug: %s (warned once; the last topology "
                        "read stays)", exc, extra={"reason": str(exc)})
        self._failed = failed
