"""Koordinator's formulas: batch-cpu / batch-memory to cgroup values, per container and per pod.

Pod totals: Kubernetes' effective request/limit is max(sum over the app
containers, the largest init container), since init containers run one at a
time before the app containers. The annotation (Koordinator's format) does
not tell init containers apart, so every container it lists counts as an app
container and the pod gets the plain sum, an upper bound of the effective
value that never leaves the pod below one of its containers. A spec that
lists init containers under ``initContainers`` gets the exact rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .spec import MAX_MEMORY_BYTES, MAX_MILLI_CPU, ContainerBatch, PodBatchSpec

__all__ = [
    "CFS_PERIOD",
    "MIN_QUOTA",
    "MAX_SHARES",
    "MIN_SHARES",
    "UNLIMITED",
    "CgroupValues",
    "container_values",
    "pod_totals",
    "pod_values",
    "values_of",
]

CFS_PERIOD = 100_000
MIN_SHARES = 2
MAX_SHARES = 262144  # the kernel's (and kubelet's) cap: above it a written value reads back lower
MIN_QUOTA = 1000
UNLIMITED = -1


@dataclass(frozen=True)
class CgroupValues:
    """What the hook writes; ``UNLIMITED`` (-1) means no quota / no memory limit.

    ``memory_swap``: cgroup v1's memory+swap limit (memory.memsw.limit_in_bytes)
    read, or wanted; None: none read (v2, no swap accounting), or not managed
    (a hook answer's values: the runtime sets it; a container whose swap
    kubelet asked for is not known: KnownPods.container_wanted)."""

    cpu_shares: int
    cpu_quota: int
    memory_limit: int
    cpu_period: int = CFS_PERIOD
    memory_swap: int | None = None


def shares(request_milli: int | None) -> int:
    return min(max((request_milli or 0) * 1024 // 1000, MIN_SHARES), MAX_SHARES)


def quota(limit_milli: int | None, cfs_quota_enabled: bool = True) -> int:
    if not cfs_quota_enabled or limit_milli is None or limit_milli <= 0:
        return UNLIMITED
    return max(limit_milli * CFS_PERIOD // 1000, MIN_QUOTA)


def memory_limit(limit_bytes: int | None) -> int:
    return UNLIMITED if limit_bytes is None or limit_bytes <= 0 else limit_bytes


def values_of(batch: ContainerBatch, cfs_quota_enabled: bool = True) -> CgroupValues:
    return CgroupValues(shares(batch.cpu_request), quota(batch.cpu_limit, cfs_quota_enabled), memory_limit(batch.memory_limit))


def container_values(spec: PodBatchSpec, name: str, cfs_quota_enabled: bool = True) -> CgroupValues:
    """Raises SpecError when ``name`` is not in the spec."""
    return values_of(spec.container(name), cfs_quota_enabled)


def _sum_requests(values: Iterable[int | None]) -> int:
    return sum(v or 0 for v in values)


def _sum_limits(values: Iterable[int | None]) -> int | None:
    """None (unlimited) as soon as one container has no positive limit."""
    total = 0
    for v in values:
        if v is None or v <= 0:
            return None
        total += v
    return total


def _effective(app: int | None, init: Iterable[int | None], limits: bool) -> int | None:
    init = list(init)
    if not init:
        return app
    if limits and any(v is None or v <= 0 for v in init):
        return None
    biggest = max((v or 0) for v in init)
    return None if app is None else max(app, biggest)


def pod_totals(spec: PodBatchSpec) -> ContainerBatch:
    """The pod's effective values, each capped at a container's maximum: a sum of
    many huge containers must still fit the hook API's int64 (and a cgroup file);
    the cap is still above every container, and no node has that much."""
    app, init = list(spec.containers.values()), list(spec.init_containers.values())

    def total(kind: str, maximum: int) -> int | None:
        limits = kind.endswith("limit")
        summed = (_sum_limits if limits else _sum_requests)(getattr(c, kind) for c in app)
        value = _effective(summed, (getattr(c, kind) for c in init), limits=limits)
        return None if value is None else min(value, maximum)

    return ContainerBatch(
        cpu_request=total("cpu_request", MAX_MILLI_CPU),
        cpu_limit=total("cpu_limit", MAX_MILLI_CPU),
        memory_request=total("memory_request", MAX_MEMORY_BYTES),
        memory_limit=total("memory_limit", MAX_MEMORY_BYTES),
    )


def pod_values(spec: PodBatchSpec, cfs_quota_enabled: bool = True) -> CgroupValues:
    return values_of(pod_totals(spec), cfs_quota_enabled)
