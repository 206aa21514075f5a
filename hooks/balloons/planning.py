"""What placement and a rebuild go by besides the pool: each container's
balloon type, chosen from the config alone, and the idle CPUs found shared
between containers (which no balloon owns).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from .config import BALLOON_ANNOTATION, DEFAULT, RESERVED, BalloonsConfig, BalloonType, PodContext


class UnknownBalloonType(ValueError):
    """A pod annotation names a balloon type the config does not define."""


def choose_type(config: BalloonsConfig, pod: PodContext) -> BalloonType:
    """NRI's order: the pod annotation, the reserved namespaces, the first type by
    namespace, the first type by matchExpressions, default."""
    annotations = pod.pod_annotations
    wanted = annotations.get(f"{BALLOON_ANNOTATION}/container.{pod.container_name}") or annotations.get(
        f"{BALLOON_ANNOTATION}/pod"
    ) or annotations.get(BALLOON_ANNOTATION)
    types = {t.name: t for t in config.all_types}
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
