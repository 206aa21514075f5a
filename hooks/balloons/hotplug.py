"""Noticing CPU and memory hotplug.

The topology is read from sysfs once; a CPU taken offline (or brought
online), or a node losing or gaining memory, changes what balloons may use.
The online CPUs and the nodes with memory are small files, read again at
every reconcile pass and every PreCreateContainer; when they differ from
what was last acted on, the whole topology is read again for the hook to
re-plan its balloons (:meth:`~.sync.RuntimeSync._follow_hotplug`).
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

    def changed(self) -> Topology | None:
        """The topology read again if the online CPUs or memory nodes changed
        since the last call that returned one; None otherwise, and when sysfs
        cannot be read (e.g. halfway through a change: the next call tries again)."""
        try:
            online = read_online(self.root)
            if online == self._seen:
                return None
            topology = Topology.from_sysfs(self.root)
        except TopologyError as exc:
            log.warning("cannot read the CPU topology to check for hotplug: %s", exc)
            return None
        log.warning(
            "CPU topology changed (hotplug): %s, was %s",
            topology.online.describe(), self._seen.describe(),
            extra={"online_cpus": format_cpuset(topology.online.cpus), "previous_online_cpus": format_cpuset(self._seen.cpus)},
        )
        self._seen = topology.online
        return topology
