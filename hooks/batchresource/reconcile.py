"""The reconcile loop: put back the values of running BE pods and their containers that something else changed.

Like koordlet's cgroup reconciler: once at start, then every interval. A pod
whose cgroup is gone has ended: it is forgotten (PostStopPodSandbox may never
have reached a hook that was down).

Per pod, each owned file is read once, then written in the hooks' order (a
parent never below its child): the pod's values that are below target are
raised, its containers' drifted values put back, then the pod's lowered.
A pod whose raising fails has its containers' values put back all the same
where they need no raise of the pod (lowered, shares, or raised within what
the pod has now); one raised above the pod is left for a pass that raises
it (refused, v1's cpu quota, or capped by the pod meanwhile), said once per
pod until a pass puts the pod right. The values written before the
failure are logged and counted.
The containers checked are those whose values the hook set, as the runtime
listing last saw them running (:meth:`KnownPods.owned`: the hook is told no
id at PreCreateContainer). A container whose memory limit is below its
usage has its cpu values put back all the same, its memory retried each pass.

A failure is warned of once per pod or container and reason, at debug after,
until a pass puts that cgroup right. A container whose cgroup is missing
has most likely ended since the listing (debug); one missing still after a
later listing saw it running again is warned of once (a cgroup_driver or
cgroup_root that does not match the runtime's).

The pass is synchronous, on the hook's event loop: no hook call runs
during it, so it never sees a record half changed. It writes cgroup files
only (a forgotten pod's state file is removed in the state files' thread,
:mod:`.writer`, not waited for), and none once the hook stopped
(:meth:`KnownPods.close`): the next instance may hold the socket's lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from .apply import Change, MemoryBelowUsage, apply_values
from .cgroups import CgroupFiles, Field
from .pods import KnownPods
from .resources import CgroupValues
from .spec import SpecError
from .state import PodRecord

__all__ = ["CONTAINER_RESTORED", "POD_RESTORED", "Reconciler", "reconcile_loop", "reconcile_once"]

log = logging.getLogger("hooks.batchresource")

POD_RESTORED = "batchresource reconcile restored a pod cgroup value"
CONTAINER_RESTORED = "batchresource reconcile restored a container cgroup value"
POD_FAILED = "batchresource reconcile could not restore the pod cgroup; retried next pass"
CONTAINER_FAILED = "batchresource reconcile could not restore a container cgroup; retried next pass"
NO_CGROUP = ("batchresource reconcile finds no cgroup for a container the runtime lists running "
             "(does cgroup_driver or cgroup_root match the runtime's?); retried next pass")
CONTAINERS_WAIT = ("batchresource reconcile leaves container values above their pod cgroup's for a pass "
                   "that raises the pod")
SKIPPED = "containers wait"  # (a kind said once per pod, as a failure's)
_ERRORS = (SpecError, MemoryBelowUsage, OSError, ValueError)

# A pod's or a container's cgroup: (pod key, container id; "" for the pod's).
Target = tuple[str, str]


def _kind(exc: Exception) -> str:
    """What a failure is, for saying it once: its type (and errno), not its
    text (a usage that moves each pass is the same failure)."""
    if isinstance(exc, OSError):
        return f"OSError {exc.errno}"
    return type(exc).__name__


@dataclass
class Reconciler:
    """The reconcile passes of one hook, and what they warned of."""

    pods: KnownPods
    # Reasons warned of, by target, until a pass puts it right.
    _said: dict[Target, set[str]] = field(default_factory=dict)
    # Containers found with no cgroup: the listing's count (KnownPods.listings) then.
    _missing: dict[Target, int] = field(default_factory=dict)
    _seen: set[Target] = field(default_factory=set)

    def once(self) -> int:
        """One pass; returns how many values it corrected (0 once the hook
        stopped: a next instance, maybe with another config, may hold the lock)."""
        if self.pods.closed:
            return 0
        self._seen = set()
        corrected = 0
        for record in self.pods.records():
            try:
                files = self.pods.cgroups.pod(record.cgroup_parent)
            except ValueError as exc:  # (saved by an older version): it can never be written
                log.warning("batchresource reconcile cannot map a pod's cgroup parent; forgetting it",
                            extra={"pod": record.pod, "uid": record.uid, "cgroup_parent": record.cgroup_parent,
                                   "reason": str(exc)})
                self.pods.forget(record.key, "cgroup parent maps to no cgroup")
                continue
            if not files.exists():
                self.pods.forget(record.key, "pod cgroup is gone")
                continue
            corrected += self._pod(record, files)
        self._said = {t: said for t, said in self._said.items() if t in self._seen}
        self._missing = {t: n for t, n in self._missing.items() if t in self._seen}
        return corrected

    def _warn(self, target: Target, exc: Exception, message: str, fields: Mapping[str, object]) -> None:
        level = logging.WARNING if self._first(target, _kind(exc)) else logging.DEBUG
        log.log(level, message, extra={**fields, "reason": str(exc)})

    def _right(self, target: Target) -> None:
        if self._said.pop(target, None) is not None:
            log.debug("batchresource reconcile put a cgroup right again", extra={"uid": target[0], "container_id": target[1]})
        self._missing.pop(target, None)

    def _pod(self, record: PodRecord, files: CgroupFiles) -> int:
        target = (record.key, "")
        self._seen.add(target)
        names = {"pod": record.pod, "uid": record.uid, "cgroup": str(files.relative)}
        written: list[Change] = []
        current: CgroupValues | None = None
        try:
            wanted = self.pods.wanted(record)
            current = files.read()
            apply_values(files, wanted, raise_only=True, current=current, written=written)
        except _ERRORS as exc:  # its containers get what needs no raise: see the module's docstring
            _log_pod(names, written)
            self._warn(target, exc, POD_FAILED, names)
            return len(written) + self._under_unraised(record, files, names, read=current is not None)
        _log_pod(names, written)
        corrected = len(written)
        for container_id, name in sorted(self.pods.owned(record.key).items()):
            corrected += self._container(record, container_id, name)
        written = []
        try:  # lowering: after the containers (current: the raised fields are left out)
            apply_values(files, wanted, lower_only=True, current=current, written=written)
        except _ERRORS as exc:
            self._warn(target, exc, POD_FAILED, names)
        else:
            self._right(target)
        _log_pod(names, written)
        return corrected + len(written)

    def _under_unraised(self, record: PodRecord, files: CgroupFiles, names: Mapping[str, object], *, read: bool) -> int:
        """The containers of a pod whose raise failed: their values that need
        no raise of the pod (lowered, or within its current values) put back,
        the others left for a pass that raises it (said once per pod, until
        it is put right). None when its cgroup could not be read."""
        owned = sorted(self.pods.owned(record.key).items())
        try:
            parent = files.read() if read and owned else None  # (what the failed raise left)
        except _ERRORS:
            parent = None
        if parent is None:
            self._seen.update((record.key, cid) for cid, _ in owned)  # (their warnings kept)
            return 0
        skipped: dict[str, list[str]] = {}
        corrected = sum(self._container(record, cid, name, within=parent, skipped=skipped) for cid, name in owned)
        if skipped and self._first((record.key, ""), SKIPPED):
            log.info(CONTAINERS_WAIT, extra={**names, "containers": skipped})
        return corrected

    def _first(self, target: Target, kind: str) -> bool:
        """Whether ``kind`` is new for ``target`` since it was last put right (recorded now)."""
        said = self._said.setdefault(target, set())
        new = kind not in said
        said.add(kind)
        return new

    def _container(self, record: PodRecord, container_id: str, name: str, *, within: CgroupValues | None = None,
                   skipped: dict[str, list[str]] | None = None) -> int:
        """``within``: its pod's values, as they are after its raise failed
        (a value that needs more is skipped, its fields added to ``skipped``
        by container name)."""
        target = (record.key, container_id)
        self._seen.add(target)
        names: dict[str, object] = {"pod": record.pod, "uid": record.uid, "container": name, "container_id": container_id}
        try:
            files = self.pods.cgroups.container(record.cgroup_parent, container_id)
            wanted: CgroupValues = self.pods.container_wanted(record, name)
        except (SpecError, ValueError):
            return 0  # (the pod's part of the pass warns of its spec)
        names["cgroup"] = str(files.relative)
        written: list[Change] = []
        waiting: list[Field] = []
        try:
            apply_values(files, wanted, current=files.read(), written=written, within=within, skipped=waiting)
        except FileNotFoundError as exc:
            self._no_cgroup(target, exc, names)
        except _ERRORS as exc:  # (a memory limit below its usage: the cpu values are put back all the same)
            self._warn(target, exc, CONTAINER_FAILED, names)
        else:
            if not waiting:
                self._right(target)
        if waiting and skipped is not None:
            skipped[name] = [f.value for f in waiting]
        for change in written:
            log.info(CONTAINER_RESTORED, extra={**names, "field": change.field.value, "file": change.file,
                                                "found": change.old, "wanted": change.new})
        return len(written)

    def _no_cgroup(self, target: Target, exc: FileNotFoundError, names: Mapping[str, object]) -> None:
        """Ended since the listing saw it running (its next pass drops it), unless
        a later listing saw it running again: then the cgroup is not where looked."""
        first = self._missing.setdefault(target, self.pods.listings)
        if self.pods.listings > first:
            self._warn(target, exc, NO_CGROUP, names)
        else:
            log.debug("batchresource reconcile finds no cgroup for a container; ended since the listing?",
                      extra={**names, "reason": str(exc)})


def _log_pod(names: Mapping[str, object], changes: list[Change]) -> None:
    for change in changes:
        log.info(POD_RESTORED, extra={**names, "field": change.field.value, "file": change.file,
                                      "found": change.old, "wanted": change.new,
                                      "restored": change.new})  # as the container line's; `restored`: docs named it


def reconcile_once(pods: KnownPods) -> int:
    """One pass of a new :class:`Reconciler` (it remembers no earlier pass's warnings)."""
    return Reconciler(pods).once()


async def reconcile_loop(pods: KnownPods, interval: float) -> None:
    reconciler = Reconciler(pods)
    while True:
        try:
            reconciler.once()
        except Exception:  # one bad pass must not end the loop
            log.exception("batchresource reconcile pass failed")
        await asyncio.sleep(interval)
