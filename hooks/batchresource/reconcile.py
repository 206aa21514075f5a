"""The reconcile loop: put back the values of running BE pods and their containers that something else changed.

Like koordlet's cgroup reconciler: once at start, then every interval. A pod
whose cgroup is gone has ended: it is forgotten (PostStopPodSandbox may never
have reached a hook that was down).

Per pod, each owned file is read once, then written in the hooks' order (a
parent never below its child): the pod's values that are below target are
raised, its containers' drifted values put back, then the pod's lowered.
The containers checked are those whose values the hook set, as the runtime
listing last saw them (:meth:`KnownPods.owned`: the hook is told no id at
PreCreateContainer), less those whose update the hook answered "no change".
A container whose cgroup is gone (it ended since the listing) is skipped.

The pass is synchronous, on the hook's event loop: no hook call runs
during it, so it never sees a record half changed, and it writes nothing but
cgroup files (no state file), and none once the hook stopped
(:meth:`KnownPods.close`): the next instance may hold the socket's lock.
"""

from __future__ import annotations

import asyncio
import logging

from .apply import Change, MemoryBelowUsage, apply_values
from .cgroups import CgroupFiles
from .pods import KnownPods
from .resources import CgroupValues
from .spec import SpecError
from .state import PodRecord

__all__ = ["CONTAINER_RESTORED", "POD_RESTORED", "reconcile_loop", "reconcile_once"]

log = logging.getLogger("hooks.batchresource")

POD_RESTORED = "batchresource reconcile restored a pod cgroup value"
CONTAINER_RESTORED = "batchresource reconcile restored a container cgroup value"
_ERRORS = (SpecError, MemoryBelowUsage, OSError, ValueError)


def reconcile_once(pods: KnownPods) -> int:
    """One pass; returns how many values it corrected. None once the hook
    stopped (a next instance, maybe with another config, may hold the lock)."""
    if pods.closed:
        return 0
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
        corrected += _reconcile_pod(pods, record, files)
    return corrected


def _pod_failed(record: PodRecord, files: CgroupFiles, exc: Exception) -> None:
    log.warning("batchresource reconcile could not restore the pod cgroup",
                extra={"pod": record.pod, "uid": record.uid, "cgroup": str(files.relative), "reason": str(exc)})


def _reconcile_pod(pods: KnownPods, record: PodRecord, files: CgroupFiles) -> int:
    try:
        wanted = pods.wanted(record)
        current = files.read()
        changes = apply_values(files, wanted, raise_only=True, current=current)
    except _ERRORS as exc:
        _pod_failed(record, files, exc)
        return 0
    corrected = len(changes)
    _log_pod(record, files, changes)
    for container_id, name in sorted(pods.owned(record.key).items()):
        corrected += _reconcile_container(pods, record, container_id, name)
    try:  # lowering: after the containers (current: the raised fields are left out)
        changes = apply_values(files, wanted, lower_only=True, current=current)
    except _ERRORS as exc:
        _pod_failed(record, files, exc)
        changes = list(exc.written) if isinstance(exc, MemoryBelowUsage) else []
    _log_pod(record, files, changes)
    return corrected + len(changes)


def _log_pod(record: PodRecord, files: CgroupFiles, changes: list[Change]) -> None:
    for change in changes:
        log.info(POD_RESTORED, extra={"pod": record.pod, "uid": record.uid, "cgroup": str(files.relative),
                                      "field": change.field.value, "file": change.file,
                                      "found": change.old, "restored": change.new})


def _reconcile_container(pods: KnownPods, record: PodRecord, container_id: str, name: str) -> int:
    names = {"pod": record.pod, "uid": record.uid, "container": name, "container_id": container_id}
    try:
        files = pods.cgroups.container(record.cgroup_parent, container_id)
        wanted: CgroupValues = pods.container_wanted(record, name)
    except (SpecError, ValueError):
        return 0  # (the pod's part of the pass warns of its spec)
    try:
        current = files.read()
    except FileNotFoundError:
        return 0  # ended since the listing saw it: the listing's next pass drops it
    try:
        changes = apply_values(files, wanted, current=current)
    except FileNotFoundError:
        return 0  # ended meanwhile
    except _ERRORS as exc:  # (a memory limit below its usage: the cpu values are put back all the same)
        log.warning("batchresource reconcile could not restore a container cgroup; retried next pass",
                    extra={**names, "cgroup": str(files.relative), "reason": str(exc)})
        changes = list(exc.written) if isinstance(exc, MemoryBelowUsage) else []
    for change in changes:
        log.info(CONTAINER_RESTORED, extra={**names, "cgroup": str(files.relative), "field": change.field.value,
                                            "file": change.file, "found": change.old, "wanted": change.new})
    return len(changes)


async def reconcile_loop(pods: KnownPods, interval: float) -> None:
    while True:
        try:
            reconcile_once(pods)
        except Exception:  # one bad pass must not end the loop
            log.exception("batchresource reconcile pass failed")
        await asyncio.sleep(interval)
