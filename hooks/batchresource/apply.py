"""Writing a pod's cgroup values in an order that never leaves a parent below its child.

The pod cgroup is the parent of its containers' cgroups. Raising happens
pod first: the hook raises the pod cgroup itself before it answers a
container hook, and the runtime then applies the container's values. Lowering
happens containers first: a container hook never lowers the pod; the
reconcile loop does, after the runtime has applied the containers' values.
(The pod's targets are sums of the containers', so they are never below a
container's batch value; cgroup v1 refuses a parent CFS quota below a child's.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cgroups import CgroupFiles, Field
from .resources import UNLIMITED, CgroupValues

__all__ = ["Change", "MemoryBelowUsage", "apply_values", "check_memory", "is_raise", "value_of"]


class MemoryBelowUsage(ValueError):
    """The wanted memory limit is below what the cgroup uses now."""


@dataclass(frozen=True)
class Change:
    field: Field
    old: int
    new: int


def value_of(values: CgroupValues, field: Field) -> int:
    return getattr(values, field.value)


def _rank(value: int) -> float:
    return math.inf if value == UNLIMITED else value


def is_raise(current: CgroupValues, wanted: CgroupValues, field: Field) -> bool:
    """Whether going from current to wanted gives more (unlimited is the most)."""
    return _rank(value_of(wanted, field)) >= _rank(value_of(current, field))


def check_memory(files: CgroupFiles, wanted: CgroupValues) -> None:
    if wanted.memory_limit == UNLIMITED:
        return
    usage = files.memory_usage()
    if wanted.memory_limit < usage:
        raise MemoryBelowUsage(f"memory limit {wanted.memory_limit} is below the current usage {usage}")


def apply_values(files: CgroupFiles, wanted: CgroupValues, *, raise_only: bool = False) -> list[Change]:
    """Write the fields that differ (only the raising ones with ``raise_only``); the changes made.

    Raises OSError from the cgroup files, MemoryBelowUsage before writing a memory
    limit under the usage (the other fields are still written first)."""
    current = files.read()
    changes: list[Change] = []
    for field in Field:
        if not files.differs(current, wanted, field):
            continue
        if raise_only and not is_raise(current, wanted, field):
            continue
        if field is Field.MEMORY_LIMIT and not is_raise(current, wanted, field):
            check_memory(files, wanted)
        files.write(field, wanted)
        changes.append(Change(field, value_of(current, field), value_of(wanted, field)))
    return changes
