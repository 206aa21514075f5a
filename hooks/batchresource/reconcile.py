"""The reconcile loop: put back the pod-level values of running BE pods that something else changed.

Like koordlet's cgroup reconciler: once at start, then every interval. A pod
whose cgroup is gone has ended: it is forgotten (PostStopPodSandbox may never
have reached a hook that was down).
"""

from __future__ import annotations

import asyncio
import logging

from .apply import MemoryBelowUsage
from .pods import KnownPods
from .spec import SpecError

__all__ = ["reconcile_loop", "reconcile_once"]

log = logging.getLogger("hooks.batchresource")


def reconcile_once(pods: KnownPods) -> int:
    """One pass; returns how many values it corrected."""
    corrected = 0
    for record in pods.records():
        try:
            files = pods.cgroups.pod(record.cgroup_parent)
        except ValueError as exc:  # (saved by an older version): it can never be written
            log.warning("batchresource reconcile cannot map a pod's cgroup parent; forgetting it",
                        extra={"pod": record.pod, "uid": record.uid, "cgroup_parent": record.cgroup_parent,
                               "reason": str(exc)})
            pods.forget(record.key, "cgroup parent maps to no cgroup")
            continue
        if not files.exists():
            pods.forget(record.key, "pod cgroup is gone")
            continue
        try:
            changes = pods.apply(record)
        except (SpecError, MemoryBelowUsage, OSError, ValueError) as exc:
            log.warning(
                "batchresource reconcile could not restore the pod cgroup",
                extra={"pod": record.pod, "uid": record.uid, "cgroup": str(files.relative), "reason": str(exc)},
            )
            continue
        for change in changes:
            log.info(
                "batchresource reconcile restored a pod cgroup value",
                extra={
                    "pod": record.pod,
                    "uid": record.uid,
                    "cgroup": str(files.relative),
                    "field": change.field.value,
                    "found": change.old,
                    "restored": change.new,
                },
            )
        corrected += len(changes)
    return corrected


async def reconcile_loop(pods: KnownPods, interval: float) -> None:
    while True:
        try:
            reconcile_once(pods)
        except Exception:  # one bad pass must not end the loop
            log.exception("batchresource reconcile pass failed")
        await asyncio.sleep(interval)
