"""Which CPUs a balloon takes when it grows, and which it gives back when it shrinks.

Pure functions of a :class:`~.topology.Topology` and sets of CPU ids, so the
policy is testable on synthetic machines. The aim is compactness: a balloon
first completes the cores it already has threads on, then takes whole free
cores in the NUMA nodes (then packages) it already uses; a new balloon goes
to the NUMA node whose free CPUs fit it most tightly, keeping large holes for
large balloons. Shrinking gives back lone threads and CPUs in the balloon's
least used NUMA node first.
"""

from __future__ import annotations

from collections.abc import Iterable

from .topology import Topology


def _free_by_core(topology: Topology, free: set[int], node: int) -> dict[int, list[int]]:
    cores: dict[int, list[int]] = {}
    for cpu in sorted(free & topology.node_cpus[node]):
        cores.setdefault(topology.cpus[cpu].core, []).append(cpu)
    return cores


def _pick_core(topology: Topology, cores: dict[int, list[int]], remaining: int) -> int:
    """A whole free core when the balloon needs at least a core; otherwise the
    core whose free threads fit the remainder most tightly (no needless split)."""
    whole = [core for core, cpus in cores.items() if len(cpus) == len(topology.core_cpus[core])]
    fitting_whole = [core for core in whole if len(cores[core]) <= remaining]
    if fitting_whole:
        return min(fitting_whole, key=lambda core: (-len(cores[core]), core))
    fits = [core for core, cpus in cores.items() if len(cpus) >= remaining]
    if fits:
        return min(fits, key=lambda core: (len(cores[core]), core in whole, core))
    return max(cores, key=lambda core: (len(cores[core]), -core))


def _node_order(topology: Topology, free: set[int], near: frozenset[int], count: int) -> list[int]:
    free_in = {node: len(free & cpus) for node, cpus in topology.node_cpus.items()}
    if near:
        near_nodes: dict[int, int] = {}
        for cpu in near:
            node = topology.cpus[cpu].node
            near_nodes[node] = near_nodes.get(node, 0) + 1
        packages = {topology.cpus[cpu].package for cpu in near}

        def key(node: int) -> tuple[int, int, int, int]:
            package = topology.cpus[next(iter(topology.node_cpus[node]))].package
            return (-near_nodes.get(node, 0), package not in packages, -free_in[node], node)

        return sorted(topology.node_cpus, key=key)
    fitting = sorted((node for node in free_in if free_in[node] >= count), key=lambda n: (free_in[n], n))
    package_free: dict[int, int] = {}
    for node, n in free_in.items():
        package = topology.cpus[next(iter(topology.node_cpus[node]))].package
        package_free[package] = package_free.get(package, 0) + n
    rest = sorted(
        (node for node in free_in if node not in fitting),
        key=lambda n: (-package_free[topology.cpus[next(iter(topology.node_cpus[n]))].package], -free_in[n], n),
    )
    return fitting + rest


def take(topology: Topology, free: Iterable[int], count: int, near: Iterable[int] = ()) -> frozenset[int] | None:
    """``count`` CPUs out of ``free`` for a balloon that holds ``near``; None if too few are free."""
    pool = set(free)
    near = frozenset(near)
    if count <= 0:
        return frozenset()
    if count > len(pool):
        return None
    chosen: set[int] = set()
    # Complete the cores the balloon already has threads on.
    for cpu in sorted(pool):
        if len(chosen) == count:
            break
        if any(other in near for other in topology.siblings(cpu)):
            chosen.add(cpu)
    pool -= chosen
    for node in _node_order(topology, pool, near | chosen, count - len(chosen)):
        while len(chosen) < count:
            cores = _free_by_core(topology, pool, node)
            if not cores:
                break
            core = _pick_core(topology, cores, count - len(chosen))
            picked = cores[core][: count - len(chosen)]
            chosen.update(picked)
            pool.difference_update(picked)
        if len(chosen) == count:
            break
    return frozenset(chosen)


def reserve(
    topology: Topology, available: Iterable[int], count: int, keep: Iterable[int] = (), avoid: Iterable[int] = ()
) -> frozenset[int] | None:
    """``count`` reserved CPUs out of ``available``; None if too few. On a
    re-plan (hotplug, a reload, a restart) ``keep`` is the reserved set
    before: the part still available stays (its most compact ``count`` if
    more), topped up near it from CPUs outside ``avoid`` (those running
    containers); when these fall short, all of them and the fewest of
    ``avoid`` needed. Neither: a compact fresh pick.

    The fresh pick, the set a first start takes, comes first when it is
    within ``keep`` (a smaller ``count`` at a reload or hotplug, rather than
    the most compact part; a restart's ``keep`` holds the idle CPUs too when
    the reserved type shares them: its most compact part need not be the
    reserved set) or, with nothing kept, outside ``avoid`` (a pick made
    around the busy CPUs would prefer a core whose other thread is busy)."""
    available = frozenset(available)
    kept = frozenset(keep) & available
    fresh = take(topology, available, count)
    if fresh is not None and (fresh <= kept if kept else not fresh & frozenset(avoid)):
        return fresh
    if len(kept) > count:
        kept -= give_back(topology, kept, len(kept) - count)
    rest = available - kept
    idle = rest - frozenset(avoid)
    need = count - len(kept)
    if len(idle) >= need:
        more = take(topology, idle, need, near=kept)
    else:
        busy = take(topology, rest - idle, need - len(idle), near=kept | idle)
        more = None if busy is None else idle | busy
    return None if more is None else kept | more


def give_back(topology: Topology, owned: Iterable[int], count: int) -> frozenset[int]:
    """The ``count`` CPUs of ``owned`` to release so that what stays is most compact."""
    keep = set(owned)
    released: set[int] = set()
    for _ in range(min(count, len(keep))):

        def key(cpu: int) -> tuple[int, int, int]:
            info = topology.cpus[cpu]
            in_node = len(keep & topology.node_cpus[info.node])
            in_core = len(keep & topology.core_cpus[info.core])
            return (in_node, in_core, -cpu)

        cpu = min(keep, key=key)
        keep.discard(cpu)
        released.add(cpu)
    return frozenset(released)
