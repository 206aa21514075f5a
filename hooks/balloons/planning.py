"""What placement and a rebuild go by besides the pool: each container's
balloon type, chosen from the config alone, the containers a rebuild puts
back (:class:`Restored`), the idle CPUs found shared between containers
(which no balloon owns), and, for reserved CPUs given as a quantity, which
to keep.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from . import allocator
from .balloon import ContainerKey, Member
from .config import BALLOON_ANNOTATION, DEFAULT, RESERVED, BalloonsConfig, BalloonType, PodContext
from .topology import Topology


class UnknownBalloonType(ValueError):
    """A pod annotation names a balloon type the config does not define."""


def choose_type(config: BalloonsConfig, pod: PodContext) -> BalloonType:
    """NRI's order: the pod annotation, the reserved namespaces, the first type by
    namespace, the first type by matchExpressions, default."""
    annotations = pod.pod_annotations
    wanted = annotations.get(f"{BALLOON_ANNOTATION}/container.{pod.container_name}") or annotations.get(
        f"{BALLOON_ANNOTATION}/pod"
    ) or annotations.get(BALLOON_ANNOTATION)
    types = config.types_by_name
    if wanted:
        if wanted not in types:
            raise UnknownBalloonType(
                f"pod annotation {BALLOON_ANNOTATION} names balloon type {wanted!r}, which the config does not "
                f"define (types: {', '.join(sorted(types))})"
            )
        return types[wanted]
    # kube-system always, as in NRI's balloons: the key adds namespaces to it.
    if pod.namespace == "kube-system" or any(
        fnmatch.fnmatchcase(pod.namespace, pattern) for pattern in config.reserved_pool_namespaces
    ):
        return types[RESERVED]
    for btype in config.balloon_types:
        if any(fnmatch.fnmatchcase(pod.namespace, pattern) for pattern in btype.namespaces):
            return btype
    for btype in config.balloon_types:
        if btype.match_expressions and all(e.matches(pod) for e in btype.match_expressions):
            return btype
    return types[DEFAULT]


class Planned(NamedTuple):
    """A container's balloon as a re-plan left it (Restored.planned)."""

    btype: str  # that balloon's type
    own_cpus: frozenset[int]  # its own CPUs, the reserved ones taken out
    index: int | None = None  # type: ignore[assignment]  # (a field named as tuple.index) Its index: the balloon made again for it keeps its name (logs, status)

    @property
    def name(self) -> str:
        """Its balloon's name (Balloon.name): those of a balloon left without own CPUs rejoin only each other."""
        return "" if self.index is None else f"{self.btype}[{self.index}]"


@dataclass(frozen=True)
class Restored:
    """A container to put back: what it is and what it runs on now."""

    member: Member
    pod: PodContext
    cpus: frozenset[int]
    mems: str = ""
    # Cpusets the hook gave it so far (a re-plan's, see Move.answers): a move
    # under way across the re-plan is then taken for applied, as it is.
    answers: int = 0
    # A re-plan's, set for a container whose cpuset does not tell its
    # balloon (under pinCPU: false, which names no CPUs, or ``astray``) or
    # that balloon's own CPUs (one on its balloon's cpuset, which may hold
    # idle CPUs: shareIdleCPUsInSame): that balloon's type and own CPUs. It
    # goes back there if its type is still that one, rather than placed anew
    # or on a guess, which would move it (its memory too) and the containers
    # of that balloon.
    planned: Planned | None = None
    # Not known to run on the balloon it was given: its move there refused, or unsure.
    astray: bool = False
    # In the default balloon, the type its pod chose having no room for it:
    # that type, which a rebuild gives it if it now can (Pool.rehome).
    fallback: str = ""
    # A re-plan's, for one on every CPU of its plan's machine (then not
    # pinned, ``cpus`` empty): those CPUs, what it runs on, recorded so that it
    # is moved only if its balloon's cpuset differs (one sharing every idle CPU).
    everywhere: frozenset[int] = frozenset()
    # A restart's: when it was created (FoundContainer.created_at; 0: not
    # known). Those the saved balloons do not hold are placed in
    # :func:`creation_order`.
    created: int = 0

    def order(self, config: BalloonsConfig, usable: frozenset[int]) -> tuple[bool, bool]:
        """Its turn in a re-plan's rebuild, first to last: one whose balloon
        was of the type ``config`` gives it (or the default one that type
        could not take it from) with own CPUs left in ``usable`` (available,
        not reserved), then such a one without, then the others (their type
        changed; a restart's, with no plan, keep their order)."""
        if self.planned is None or type_or_default(config, self.pod)[0].name not in (self.planned.btype, self.fallback):
            return True, True
        return False, not self.planned.own_cpus & usable


def creation_order(created: int, container_id: str) -> tuple[bool, int, str]:
    """Sort key of containers found running that are placed as new ones (a
    restart's that the saved balloons do not hold, reconcile's adopted): the
    order they were created (CRI created_at), as placement took them at run
    time, not the runtime's listing order. One whose creation time is not
    known (0) goes after them: first, it would take room the others had at
    run time. Ties by id, so that any listing order gives the same placement."""
    return created <= 0, created, container_id


def balloon_mates(found: Iterable[Restored]) -> dict[str, frozenset[ContainerKey]]:
    """A re-plan's containers by the balloon they were in (Planned.name)."""
    mates: dict[str, set[ContainerKey]] = {}
    for item in found:
        if item.planned is not None and item.planned.name:
            mates.setdefault(item.planned.name, set()).add(item.member.key)
    return {name: frozenset(keys) for name, keys in mates.items()}


def shared_cpus(cpusets: Iterable[frozenset[int]]) -> frozenset[int]:
    """CPUs that two cpusets have in common while each has CPUs the other
    lacks: idle CPUs shared by shareIdleCPUsInSame, which no balloon owns.
    Counted as owned, they would join balloons on a rebuild. (The containers
    of one balloon run on the same cpuset, or, while a move is under way,
    one within the other.)"""
    distinct = list(set(cpusets))
    shared: set[int] = set()
    for i, a in enumerate(distinct):
        for b in distinct[i + 1:]:
            common = a & b
            if common and common != a and common != b:
                shared |= common
    return frozenset(shared)


def reserved_to_keep(
    config: BalloonsConfig, topology: Topology, running: Iterable[tuple[PodContext, frozenset[int]]],
    before: frozenset[int] | None,
) -> tuple[frozenset[int], frozenset[int]]:
    """For reserved CPUs given as a quantity (allocator.reserve): the reserved
    CPUs to keep, and the CPUs containers run on, to avoid when topping them
    up. ``running``: each container's pod and the CPUs it runs on (none, or
    every CPU: not pinned). ``before``: the reserved CPUs of the plan a
    re-plan replaces. None at start-up: the CPUs the reserved type's
    containers run on (:func:`_surely_reserved`), not a fresh pick: a reload
    or hotplug may have kept others, which a fresh pick would take from the
    balloons holding them now."""
    pinned = [(pod, cpus) for pod, cpus in running if cpus and cpus != topology.all_cpus]
    if before is not None:
        return before, frozenset().union(*(cpus for _, cpus in pinned)) - before
    shared = shared_cpus(cpus for _, cpus in pinned)
    keep: set[int] = set()
    others = []
    for pod, cpus in pinned:
        btype = type_or_default(config, pod)[0]
        if btype.name == RESERVED:
            keep |= cpus - shared
        else:
            others.append((btype.share_idle_cpus_in_same, cpus))
    # A balloon without CPUs runs its containers on the reserved CPUs (or, at
    # system scope, the idle ones): not busy.
    busy = frozenset().union(*(cpus - shared for _, cpus in others if not cpus - shared <= keep))
    # The idle CPUs containers share are avoided too: none is reserved (a
    # balloon without CPUs runs on the reserved ones alone, which shared_cpus
    # then does not count), and reserving one would take it out of the
    # cpusets of the containers sharing it.
    return _surely_reserved(config, topology, frozenset(keep) - busy, others), busy | shared


def _surely_reserved(
    config: BalloonsConfig, topology: Topology, kept: frozenset[int], others: list[tuple[str, frozenset[int]]],
) -> frozenset[int]:
    """A restart's reserved CPUs to keep, out of ``kept``: those the reserved
    type's containers run on, and no other container (the idle ones too,
    when that type shares them). A CPU of ``kept`` in the scope of another
    container that shares idle CPUs (``others``: each one's scope and
    cpuset) but not in its cpuset is not idle, or that container would run
    on it: it is reserved (if the config is the one they were placed by:
    the hook keeps no record to tell; a wider scope now than then takes in
    idle CPUs). Those found so first, topped up to the reserved count near
    them from the rest of ``kept`` (which cannot be told from idle CPUs no
    other container shares); all of ``kept`` when none is found
    (allocator.reserve then takes the first start's pick if it lies within,
    else their most compact part), or more than the count (a smaller
    quantity, or such a wider scope) when the first start's pick lies
    within it (else those found: their most compact part). With no reserved
    container (``kept`` empty) nothing is told so: a CPU in such a scope
    that no container runs on may be reserved or an empty balloon's
    (minBalloons)."""
    sure = frozenset().union(*(
        (kept & topology.scope_cpus(scope, cpus)) - cpus for scope, cpus in others
        if scope and not cpus <= kept  # a balloon without CPUs: on the reserved CPUs, or the idle ones
    ))
    count = config.reserved_count
    if len(sure) > count:
        # A smaller quantity than the containers were placed by, or a config
        # whose types share idle CPUs in wider scopes than then (sure then
        # holds idle CPUs): the first start's pick where the reserved
        # containers run on it, as with none told, else the most compact part
        # of those told, as a reload keeps fewer (allocator.reserve).
        fresh = allocator.take(topology, config.available_cpus(topology.all_cpus), count)
        return kept if fresh is not None and fresh <= kept else sure
    if not sure or len(sure) == count:
        return sure or kept
    more = allocator.take(topology, kept - sure, count - len(sure), near=sure)
    return sure | more if more is not None else kept


def type_or_default(config: BalloonsConfig, pod: PodContext) -> tuple[BalloonType, UnknownBalloonType | None]:
    """The pod's container's balloon type (:func:`choose_type`) and None; or,
    when its annotation names a type the config does not define, the default
    type and that error (a container already running cannot be refused)."""
    try:
        return choose_type(config, pod), None
    except UnknownBalloonType as exc:
        return config.types_by_name[DEFAULT], exc
