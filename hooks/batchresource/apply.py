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

import contextlib
from dataclasses import dataclass

from .cgroups import CgroupFiles, Field, MemoryBelowUsage, page_floor, rank
from .resources import UNLIMITED, CgroupValues

__all__ = ["Change", "MemoryBelowUsage", "apply_values", "check_memory", "exceeds", "is_raise", "value_of"]


@dataclass(frozen=True)
class Change:
    """A value written: ``old`` and ``new`` are those of ``file`` (the field's
    file that differed: on v1 the quota's period alone may have)."""

    field: Field
    old: int
    new: int
    file: str = ""


def value_of(values: CgroupValues, field: Field) -> int:
    return getattr(values, field.value)


def _quota_order(a: CgroupValues, b: CgroupValues) -> int:
    """Above 0 when ``a``'s cpu quota gives more than ``b``'s, 0 when the same,
    below 0 when less: per period, as the kernel compares them (50000/100000
    is more than 100000/400000); unlimited is the most."""
    if UNLIMITED in (a.cpu_quota, b.cpu_quota):
        return (a.cpu_quota == UNLIMITED) - (b.cpu_quota == UNLIMITED)
    return a.cpu_quota * b.cpu_period - b.cpu_quota * a.cpu_period


def is_raise(current: CgroupValues, wanted: CgroupValues, field: Field) -> bool:
    """Whether going from current to wanted gives more (unlimited is the most;
    a quota compared per period)."""
    if field is Field.CPU_QUOTA:
        return _quota_order(wanted, current) >= 0
    return rank(value_of(wanted, field)) >= rank(value_of(current, field))


def exceeds(parent: CgroupValues, wanted: CgroupValues, field: Field) -> bool:
    """Whether a child's wanted ``field`` is above its parent's current value:
    refused (v1, a cpu quota above the parent's) or capped by the parent until
    the parent is raised (a memory limit; an unlimited quota, which v1 takes
    under a limited parent). Shares are weights among siblings: never."""
    if field is Field.CPU_SHARES:
        return False
    if field is Field.CPU_QUOTA:
        return _quota_order(wanted, parent) > 0
    theirs: int | None = value_of(parent, field)
    mine: int | None = value_of(wanted, field)
    return theirs is not None and mine is not None and rank(page_floor(mine)) > rank(theirs)


def check_memory(files: CgroupFiles, wanted: CgroupValues) -> None:
    if wanted.memory_limit == UNLIMITED:
        return
    usage = files.memory_usage()
    if wanted.memory_limit < usage:
        raise MemoryBelowUsage(f"memory limit {wanted.memory_limit} is below the current usage {usage}")


def apply_values(files: CgroupFiles, wanted: CgroupValues, *, raise_only: bool = False, lower_only: bool = False,
                 current: CgroupValues | None = None, written: list[Change] | None = None,
                 within: CgroupValues | None = None, skipped: list[Field] | None = None) -> list[Change]:
    """Write the fields that differ (only the raising ones with ``raise_only``,
    only the lowering ones with ``lower_only``); the changes made. ``current``:
    the values read already (the reconcile pass reads each file once, then
    raises, and lowers after the containers), else they are read here.
    ``written``: a list each change is appended to as it is made, so a caller
    still has the values written before an error (the returned list otherwise).
    ``within``: the parent's current values when it could not be raised: a
    field raised above them is left out (added to ``skipped``), as it needs
    the parent raised first, and a raised memsw with its memory limit left
    out; lowering, or raising within them, is written.

    Raises OSError from the cgroup files, MemoryBelowUsage before writing a memory
    limit (or v1 memory+swap limit) under the usage (the other fields are still
    written first)."""
    if current is None:
        current = files.read()
    changes: list[Change] = [] if written is None else written
    skipped_limit = False
    for field in Field:
        if not files.differs(current, wanted, field):
            continue
        raising = is_raise(current, wanted, field)
        if (raise_only and not raising) or (lower_only and raising):
            continue
        # memsw raised while its limit waits would be swap the container never
        # asked for (the pod's memsw, unlimited, bounds it not): it waits too
        if within is not None and raising and (exceeds(within, wanted, field) or (
                field is Field.MEMORY_SWAP and skipped_limit)):
            skipped_limit = skipped_limit or field is Field.MEMORY_LIMIT
            if skipped is not None:
                skipped.append(field)
            continue
        if field is Field.MEMORY_LIMIT and not raising:
            check_memory(files, wanted)
        try:
            files.write(field, wanted)
        except (OSError, MemoryBelowUsage):
            if field is Field.MEMORY_LIMIT:  # the callers catch the write's own error
                # (memsw raising in a lowering pass: the raising pass's, counted there)
                theirs = (lower_only and files.differs(current, wanted, Field.MEMORY_SWAP)
                          and is_raise(current, wanted, Field.MEMORY_SWAP))
                with contextlib.suppress(OSError, ValueError):
                    changes.extend(_landed(files, current, wanted, memsw=not theirs))
            raise
        name, old, new = files.changed(current, wanted, field)
        changes.append(Change(field, old, new, name))
    return changes


def _landed(files: CgroupFiles, current: CgroupValues, wanted: CgroupValues, *, memsw: bool) -> list[Change]:
    """cgroup v1, a memory limit's write failed part way (memsw written, then
    the limit refused or left below its usage; the limit written, then memsw
    refused): what of it landed, as changes."""
    now = files.read()
    fields = (Field.MEMORY_LIMIT, Field.MEMORY_SWAP) if memsw else (Field.MEMORY_LIMIT,)
    landed = []
    for field in fields:
        if files.differs(current, wanted, field) and not files.differs(now, wanted, field):
            name, old, new = files.changed(current, wanted, field)
            landed.append(Change(field, old, new, name))
    return landed
