"""CPU topology from sysfs: which CPUs share a core, a NUMA node, a package.

Read from ``<root>/devices/system/cpu`` and ``<root>/devices/system/node``;
the root is injectable so tests (and the allocator's unit tests) can build
synthetic machines. Also the cpuset list format ("0-3,8") both ways.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from runtimeproxy.hookpath.validate import format_id_list


class TopologyError(RuntimeError):
    """sysfs does not describe a usable CPU topology."""


MAX_CPU_ID = 1 << 16  # past any machine's CPU ids (the kernel's NR_CPUS tops out at 8192)


def parse_cpuset(text: str) -> frozenset[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}; '' -> {}. ValueError on anything else."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        start, end = int(lo), int(hi) if sep else int(lo)
        if start < 0 or end < start:
            raise ValueError(f"bad cpuset range {part!r}")
        if end >= MAX_CPU_ID:  # a typo, not a machine: refused before a set of billions is built
            raise ValueError(f"cpuset range {part!r} names CPUs past {MAX_CPU_ID - 1}")
        out.update(range(start, end + 1))
    return frozenset(out)


def format_cpuset(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8' (the kernel's list format, as the proxy writes it)."""
    return format_id_list(cpus)


@dataclass(frozen=True)
class Online:
    """What CPU and memory hotplug change: the online CPUs, the NUMA nodes with
    memory (None where sysfs does not say)."""

    cpus: frozenset[int]
    memory_nodes: frozenset[int] | None

    def describe(self) -> str:
        memory = "unknown" if self.memory_nodes is None else format_cpuset(self.memory_nodes)
        return f'cpus "{format_cpuset(self.cpus)}", memory nodes "{memory}"'


@dataclass(frozen=True)
class Cpu:
    id: int
    package: int
    node: int
    core: int  # an id unique on the machine: (package, die, core_id) numbered


@dataclass(frozen=True)
class Topology:
    cpus: dict[int, Cpu]
    # NUMA nodes with memory (sysfs "has_memory"); None: every node has some.
    memory_nodes: frozenset[int] | None = None
    # node -> {node: NUMA distance}, from each node's "distance" file
    distances: dict[int, dict[int, int]] = field(default_factory=dict)
    # derived lookups, built once
    core_cpus: dict[int, frozenset[int]] = field(init=False, repr=False)
    node_cpus: dict[int, frozenset[int]] = field(init=False, repr=False)
    package_cpus: dict[int, frozenset[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        def group(key: str) -> dict[int, frozenset[int]]:
            out: dict[int, set[int]] = {}
            for cpu in self.cpus.values():
                out.setdefault(getattr(cpu, key), set()).add(cpu.id)
            return {k: frozenset(v) for k, v in sorted(out.items())}

        object.__setattr__(self, "core_cpus", group("core"))
        object.__setattr__(self, "node_cpus", group("node"))
        object.__setattr__(self, "package_cpus", group("package"))

    @property
    def all_cpus(self) -> frozenset[int]:
        return frozenset(self.cpus)

    @property
    def online(self) -> Online:
        return Online(self.all_cpus, self.memory_nodes)

    def siblings(self, cpu: int) -> frozenset[int]:
        return self.core_cpus[self.cpus[cpu].core]

    def scope_cpus(self, scope: str, cpus: Iterable[int]) -> frozenset[int]:
        """The CPUs in the same ``scope`` (shareIdleCPUsInSame: ``system``,
        ``package``, ``numa``, ``core``) as any of ``cpus`` (online ones):
        where a balloon of ``cpus`` shares the idle CPUs. ``system``: every
        CPU, whatever ``cpus`` are."""
        if scope == "system":
            return self.all_cpus
        groups, attr = {"package": (self.package_cpus, "package"), "numa": (self.node_cpus, "node"),
                        "core": (self.core_cpus, "core")}[scope]
        return frozenset().union(*(groups[getattr(self.cpus[c], attr)] for c in cpus if c in self.cpus))

    def nodes_of(self, cpus: Iterable[int]) -> frozenset[int]:
        return frozenset(self.cpus[c].node for c in cpus)

    def mems_of(self, cpus: Iterable[int]) -> frozenset[int]:
        """The memory nodes for a cpuset: its CPUs' nodes that have memory; for
        CPUs on memory-less nodes only, the nearest nodes with memory (where the
        kernel takes their memory from). A cpuset.mems naming a node without
        memory is refused on cgroup v1 (EINVAL), so the container would not start;
        cgroup v2 from kernel 5.18 takes it but grants nothing from it (the
        parent's nodes, if no node named has memory); older v2 kernels refuse it too."""
        nodes = self.nodes_of(cpus)
        if self.memory_nodes is None or nodes <= self.memory_nodes:
            return nodes
        if nodes & self.memory_nodes or not self.memory_nodes:
            return nodes & self.memory_nodes
        nearest: set[int] = set()
        for node in nodes:
            known = {m: d for m, d in self.distances.get(node, {}).items() if m in self.memory_nodes}
            if not known:
                return self.memory_nodes  # no distances: any node with memory is as good
            closest = min(known.values())
            nearest.update(m for m, d in known.items() if d == closest)
        return frozenset(nearest)

    @classmethod
    def synthetic(cls, packages: int, nodes_per_package: int, cores_per_node: int, threads: int) -> Topology:
        """A regular machine, numbered like Linux does: first threads of all cores, then the second ones."""
        cores = packages * nodes_per_package * cores_per_node
        cpus: dict[int, Cpu] = {}
        for thread in range(threads):
            for core in range(cores):
                cpu_id = thread * cores + core
                node = core // cores_per_node
                cpus[cpu_id] = Cpu(cpu_id, package=node // nodes_per_package, node=node, core=core)
        return cls(cpus)

    @classmethod
    def from_sysfs(cls, root: str | os.PathLike[str] = "/sys") -> Topology:
        base = Path(root) / "devices" / "system"
        online = _online_cpus(base / "cpu")
        node_of: dict[int, int] = {}
        node_dir = base / "node"
        for path in sorted(node_dir.glob("node[0-9]*")):
            try:
                for cpu in parse_cpuset((path / "cpulist").read_text()):
                    node_of[cpu] = int(path.name[4:])
            except (OSError, ValueError) as exc:
                raise TopologyError(f"cannot read {path / 'cpulist'}: {exc}") from exc
        memory_nodes, distances = _read_memory_nodes(node_dir)
        core_ids: dict[tuple[int, int, int], int] = {}
        cpus: dict[int, Cpu] = {}
        for cpu_id in sorted(online):
            topo = base / "cpu" / f"cpu{cpu_id}" / "topology"
            try:
                package = int((topo / "physical_package_id").read_text())
                core_id = int((topo / "core_id").read_text())
                die_path = topo / "die_id"
                die = int(die_path.read_text()) if die_path.exists() else 0
            except (OSError, ValueError) as exc:
                raise TopologyError(f"cannot read the topology of cpu{cpu_id} under {topo}: {exc}") from exc
            core = core_ids.setdefault((package, die, core_id), len(core_ids))
            cpus[cpu_id] = Cpu(cpu_id, package=package, node=node_of.get(cpu_id, 0), core=core)
        if not cpus:
            raise TopologyError(f"no online CPUs under {base / 'cpu'}")
        return cls(cpus, memory_nodes, distances)


def read_online(root: str | Path = "/sys") -> Online:
    """The online CPUs and the nodes with memory alone (``cpu/online`` and
    ``node/has_memory``, two small files): cheap enough to read at every hook
    call that places a container (hotplug is noticed so). The same as
    :meth:`Topology.from_sysfs` gives for them (``Topology.online``)."""
    base = Path(root) / "devices" / "system"
    return Online(_online_cpus(base / "cpu"), _memory_nodes(base / "node"))


def _online_cpus(cpu_dir: Path) -> frozenset[int]:
    try:
        return parse_cpuset((cpu_dir / "online").read_text())
    except (OSError, ValueError) as exc:
        raise TopologyError(f"cannot read online CPUs under {cpu_dir}: {exc}") from exc


def _memory_nodes(node_dir: Path) -> frozenset[int] | None:
    """The nodes with memory; None where sysfs does not say (no NUMA support)."""
    try:
        return parse_cpuset((node_dir / "has_memory").read_text())
    except (OSError, ValueError):
        return None


def _read_memory_nodes(node_dir: Path) -> tuple[frozenset[int] | None, dict[int, dict[int, int]]]:
    """Which NUMA nodes have memory (None where sysfs does not say, no NUMA
    support: every node then counts as having memory), and the distances
    between the online nodes ({} where ``node/online`` does not say)."""
    memory = _memory_nodes(node_dir)
    if memory is None:
        return None, {}
    try:
        online = sorted(parse_cpuset((node_dir / "online").read_text()))
    except (OSError, ValueError):
        return memory, {}
    distances: dict[int, dict[int, int]] = {}
    for node in online:
        try:  # one number per online node, in node order
            row = [int(d) for d in (node_dir / f"node{node}" / "distance").read_text().split()]
        except (OSError, ValueError):
            continue
        if len(row) == len(online):
            distances[node] = dict(zip(online, row, strict=True))
    return memory, distances


def write_synthetic_sysfs(root: Path, topology: Topology) -> None:
    """Lay ``topology`` out as sysfs files under ``root`` (for tests of the sysfs reader)."""
    base = root / "devices" / "system"
    (base / "cpu").mkdir(parents=True, exist_ok=True)
    (base / "cpu" / "online").write_text(format_cpuset(topology.cpus) + "\n")
    for cpu in topology.cpus.values():
        topo = base / "cpu" / f"cpu{cpu.id}" / "topology"
        topo.mkdir(parents=True, exist_ok=True)
        (topo / "physical_package_id").write_text(f"{cpu.package}\n")
        (topo / "core_id").write_text(f"{cpu.core}\n")
        (topo / "die_id").write_text("0\n")
        (topo / "thread_siblings_list").write_text(format_cpuset(topology.siblings(cpu.id)) + "\n")
    nodes = sorted(set(topology.node_cpus) | (topology.memory_nodes or set()))
    for node in nodes:
        path = base / "node" / f"node{node}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpulist").write_text(format_cpuset(topology.node_cpus.get(node, ())) + "\n")
        row = topology.distances.get(node, {})
        (path / "distance").write_text(" ".join(str(row.get(n, 10 if n == node else 20)) for n in nodes) + "\n")
    (base / "node" / "online").write_text(format_cpuset(nodes) + "\n")
    memory = topology.memory_nodes if topology.memory_nodes is not None else nodes
    (base / "node" / "has_memory").write_text(format_cpuset(memory) + "\n")
