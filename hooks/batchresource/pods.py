"""The BE pods the hook knows (memory + state dir) and their pod cgroups.

The state files are written off the event loop, in :mod:`.writer`'s thread,
in the order asked (so a pod's writes land in order); each write gets a copy
of the pod made as it is asked, and its outcome is taken in on the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from .apply import Change, apply_values
from .cgroups import (
    CgroupFiles,
    container_relative_path,
    detect_version,
    parent_relative_path,
    rank,
)
from .config import BatchResourceConfig
from .resources import UNLIMITED, CgroupValues, container_values, pod_values
from .spec import parse_spec
from .state import ContainerKey, PodRecord, SavedPod, StateDir
from .writer import StateWriter, Written, outcome

__all__ = ["Cgroups", "KnownPods", "Warn"]

log = logging.getLogger("hooks.batchresource")

# How a caller has a warning logged: (message, fields). The runtime listing's
# says each thing once per sandbox; a hook call's logs each.
Warn = Callable[[str, Mapping[str, object]], object]  # (what it returns is not used)


def _warn(message: str, fields: Mapping[str, object]) -> None:
    log.warning(message, extra=dict(fields))


@dataclass(frozen=True)
class Cgroups:
    """Maps cgroup parents and container ids to their cgroup files."""

    config: BatchResourceConfig

    @property
    def version(self) -> int:
        return self.config.cgroup_version or detect_version(self.config.cgroup_root)

    def _files(self, relative: PurePosixPath) -> CgroupFiles:
        return CgroupFiles(self.config.cgroup_root, self.version, relative)

    def pod(self, cgroup_parent: str) -> CgroupFiles:
        return self._files(parent_relative_path(cgroup_parent, self.config.cgroup_driver))

    def container(self, cgroup_parent: str, container_id: str) -> CgroupFiles:
        return self._files(container_relative_path(cgroup_parent, container_id, self.config.cgroup_driver))


class KnownPods:
    """Running BE pods by key (``state.pod_key``: the uid), as PreRunPodSandbox
    (or a later container hook) told the hook."""

    def __init__(self, config: BatchResourceConfig) -> None:
        self._config = config
        self._writer = StateWriter(StateDir(config.state_dir))
        self._pods: dict[str, PodRecord] = {}  # load() fills it, once the hook holds its socket lock
        # The containers the hook set values for, by pod key (None: a state
        # file from before the list existed, so not known).
        self._containers: dict[str, set[ContainerKey] | None] = {}
        # The hook's answers for a pod whose list is None, kept until the
        # listing adopts its running containers (merged in then: one answered
        # but not created yet is the hook's, not untold).
        self._unadopted: dict[str, set[ContainerKey]] = {}
        # Pods whose containers list changed since their file was written
        # (flush() writes them: off the hook's answers, once per pod).
        self._dirty: set[str] = set()
        # Pods whose last save failed: warned of once, until one succeeds.
        self._failing: set[str] = set()
        # The save remember() asked for a pod new to the hook, until it ends:
        # a second call for the pod meanwhile waits for it too.
        self._tracking: dict[str, Written] = {}
        # The running containers of each pod whose values the hook set (id ->
        # name), from the runtime listing's last pass: what the reconcile pass
        # checks (the hook is told no id at PreCreateContainer). In memory.
        self._owned: dict[str, dict[str, str]] = {}
        self._listings = 0  # set_owned calls: how many listings told _owned
        # The swap kubelet asked the runtime for (memory_swap_limit_in_bytes of
        # its CreateContainer or UpdateContainerResources, as the container
        # hooks saw it), by pod key and container name: the memsw the runtime
        # set. Saved with the pod (flush(), as its containers list), so a
        # restart still knows it; a container not in it (never told of, or an
        # older file) has its memsw never lowered, only raised to its limit.
        self._swap: dict[str, dict[str, int]] = {}
        # Set by close(): the next instance may hold the lock, so no file is
        # written or removed any more (a late one could overwrite its file,
        # or bring back one it removed).
        self._closed = False
        self.cgroups = Cgroups(config)

    async def load(self, hand_over: Callable[[asyncio.Future[Any]], object] | None = None) -> None:
        """Read the state dir (and remove a killed hook's temporary files),
        in the state files' thread, the loop free meanwhile: only once this
        instance holds the hook's socket lock, else a second ``hook run``
        refused as the path is in use would remove the live one's files
        (BatchResourceHook._before_serving). Pods already known stay, newer
        than their files: told before this instance's last stop (a start
        again, after a stop or a cut start), or during the read by a direct
        caller (its saves land after the read; no hook call comes before the
        listener opens, and the background starts after). The saves tracked
        before have all ended (the last stop kept its lock until they had),
        maybe on a loop now closed: forgotten, never handed to a call to
        await. A load cut during the read hands the read's join over
        (``hand_over``, :meth:`StateWriter.load`) and leaves :attr:`closed`
        as it was (set by the last stop: nothing written until a load has
        read the dir)."""
        self._tracking.clear()
        saved = await self._writer.load(hand_over)
        self._closed = False  # (the lock is this instance's again, and the dir read)
        told = {key: c for key, c in self._containers.items() if key in self._pods}
        self._pods = {**{k: pod.record for k, pod in saved.items()}, **self._pods}
        self._containers = {**{k: None if p.containers is None else set(p.containers) for k, p in saved.items()}, **told}
        for key, pod in saved.items():  # (an ask told meanwhile is newer)
            if pod.swap:
                self._swap[key] = {**pod.swap, **self._swap.get(key, {})}

    def __contains__(self, key: str) -> bool:
        return key in self._pods

    def records(self) -> list[PodRecord]:
        return list(self._pods.values())

    def record(self, key: str) -> PodRecord | None:
        return self._pods.get(key)

    def remember(self, record: PodRecord) -> Written | None:
        """Track ``record``: its file's save, which a hook call awaits before
        it answers (None when already known as it is and saved, or stopped)."""
        if self._pods.get(record.key) == record:
            return self._tracking.get(record.key)
        self._pods[record.key] = record
        # A pod new to the hook: none set yet. Without a listing no answer is
        # recorded, so the list stays unknown (no key in the file): a listing
        # enabled later adopts the running containers, not overwrites them.
        self._containers.setdefault(record.key, set() if self._config.runtime_endpoint else None)
        log.info("batchresource pod tracked", extra={"pod": record.pod, "uid": record.uid, "cgroup_parent": record.cgroup_parent})
        written = self._save(record)
        if written is not None:
            self._tracking[record.key] = written
        return written

    def _save(self, record: PodRecord, *, sync_dir: bool = True) -> Written | None:
        if self._closed:
            return None  # (stopped: the next instance's files now)
        self._dirty.discard(record.key)
        written = self._writer.save(self._copy(record), sync_dir=sync_dir)
        written.add_done_callback(functools.partial(self._saved, record))
        return written

    def _copy(self, record: PodRecord) -> SavedPod:
        """What a save writes of a known pod, copied on the loop: the thread reads nothing of ours."""
        return SavedPod(record, self.containers(record.key), dict(self._swap.get(record.key, {})))

    def _saved(self, record: PodRecord, written: Written) -> None:
        """A save's outcome, on the loop, in the order the saves were asked."""
        exc = outcome(written, "batchresource state file save failed", uid=record.uid)
        if self._tracking.get(record.key) is written:
            del self._tracking[record.key]
        if self._pods.get(record.key) is None:
            return  # forgotten meanwhile: its removal follows
        if exc is not None:  # (a uid no file can be named after) tracked all the same
            retried = isinstance(exc, OSError)
            if retried:
                self._dirty.add(record.key)  # a full or read-only disk may recover: the next pass's flush tries again
            if record.key in self._failing:
                return  # warned of already: not every pass for every pod
            self._failing.add(record.key)
            log.warning(  # (retried: by the listing's passes, which flush; said again only once it saved)
                "batchresource could not save a pod to its state directory; it stays tracked in memory, "
                "a restart of the hook forgets what was not saved",
                extra={"pod": record.pod, "uid": record.uid, "reason": str(exc),
                       "retried": retried and self._config.runtime_endpoint != ""},
            )
            return
        if record.key in self._failing:
            self._failing.discard(record.key)
            log.info("batchresource saved a pod to its state directory again", extra={"pod": record.pod, "uid": record.uid})

    def containers(self, key: str) -> frozenset[ContainerKey] | None:
        """The containers of a known pod the hook set values for; None when not
        known (a state file from an older version)."""
        containers = self._containers.get(key)
        return None if containers is None else frozenset(containers)

    def set_containers(self, key: str, add: Iterable[ContainerKey] = (), drop: Iterable[ContainerKey] = (),
                       *, adopt: bool = False) -> None:
        """Record containers as set by the hook (``add``), drop removed ones
        (``drop``); ``adopt`` starts a list unknown so far with ``add`` and
        the answers given while it was unknown. Adding (name, N) drops the
        name's lower attempts, and one below a recorded attempt is not added:
        kubelet makes attempt N only once N-1 ended, so at most one attempt
        per name is kept. In memory only: a change marks the pod for
        :meth:`flush` (a hook answer never waits for a file)."""
        if key not in self._pods:
            return  # forgotten meanwhile (stopped): nothing to record
        containers = self._containers.get(key)
        if containers is None and not adopt:  # kept for the adoption, not saved: the file has no list yet
            _record(self._unadopted.setdefault(key, set()), add, drop)
            return
        if containers is None:
            containers = self._containers[key] = set()
            add = [*self._unadopted.pop(key, ()), *add]
        before = set(containers)
        _record(containers, add, drop)
        if containers != before or adopt:  # (an empty list adopted is saved too: adopted once, not every start)
            self._dirty.add(key)

    def set_owned(self, owned: Mapping[str, Mapping[str, str]]) -> None:
        """The running containers (id -> name) whose values the hook set, by
        pod key, as the runtime listing saw them: replaces what a previous
        listing told (pods not in ``owned`` have none; a pod forgotten while
        the listing was awaited is left out)."""
        self._owned = {key: dict(ids) for key, ids in owned.items() if key in self._pods}
        self._listings += 1

    @property
    def listings(self) -> int:
        """How many listings told :meth:`set_owned` (the reconcile pass tells a
        container that ended since one from a cgroup never where it looks)."""
        return self._listings

    def owned(self, key: str) -> dict[str, str]:
        """The containers of ``key`` (id -> name) the reconcile pass keeps at their batch values."""
        return dict(self._owned.get(key, {}))

    def flush(self) -> None:
        """Save the pods whose containers list changed, each once, its rename
        not fsync-ed: a list lost to a crash only makes the listing write
        a container's values again (docs/hook-batchresource.md)."""
        for key in sorted(self._dirty):
            record = self._pods.get(key)
            if record is None:
                self._dirty.discard(key)
            else:
                self._save(record, sync_dir=False)

    def close(self) -> None:
        """Nothing written or removed any more, from now on: the hook's stop,
        while it still holds its socket's lock (the next instance reads the
        files once it has the lock); :meth:`last_saves` then."""
        self._closed = True

    @property
    def closed(self) -> bool:
        """Stopped: the next instance, with the socket's lock, writes the cgroups now."""
        return self._closed

    async def settled(self) -> None:
        """Until every state file write asked so far has ended (landed or failed)."""
        await self._writer.settled()

    def last_saves(self) -> asyncio.Future[None]:
        """The last flush, of what is dirty now (the stop's, once closed), off
        the loop once every write asked before it has landed and the
        writer's thread has ended (an fsync per pod: a stalled disk must not
        block the loop): the executor's future (:meth:`StateWriter.last`),
        for the stop to keep its lock on until it ends."""
        last = [self._copy(record) for key in sorted(self._dirty) if (record := self._pods.get(key)) is not None]
        self._dirty.clear()
        return self._writer.last(last)

    def forget(self, key: str, reason: str) -> Written | None:
        """Forget the pod now; the removal of its file (None: none to remove,
        or stopped) lands after its saves asked before. The pod's 'forgotten'
        line is logged once its removal has ended (a failure warned of first,
        apart), its ``state_file`` saying how: "removed", or "not removed".
        With no removal it is logged at once: "left" when stopped (the file
        is the next instance's, which reads it), "none" for a pod with no uid
        (it never had a file)."""
        record = self._pods.pop(key, None)
        self._containers.pop(key, None)
        self._unadopted.pop(key, None)
        self._owned.pop(key, None)
        self._swap.pop(key, None)
        self._dirty.discard(key)
        self._failing.discard(key)
        uid = key if record is None else record.uid
        removed = None
        if uid and not self._closed:  # a pod with no uid never had a state file
            removed = self._writer.remove(uid)
        if record is not None:
            fields = {"pod": record.pod, "uid": uid, "reason": reason}
            if removed is None:
                log.info("batchresource pod forgotten", extra={**fields, "state_file": "left" if uid else "none"})
            else:  # said once its file is gone (or its removal failed, said apart): what the line says is on disk
                removed.add_done_callback(functools.partial(_forgotten, fields))
        return removed

    def wanted(self, record: PodRecord) -> CgroupValues:
        """The pod cgroup's values; on v1 its memsw unlimited, as kubelet leaves
        a pod cgroup's (it writes none: the new cgroup's default)."""
        return replace(pod_values(parse_spec(record.spec), self._config.cfs_quota_enabled), memory_swap=UNLIMITED)

    def note_swap(self, key: str, name: str, swap: int) -> Written | None:
        """The swap kubelet asked for container ``name`` of a known pod, at its
        create or update (0: none, memsw equal to the memory limit). A first
        ask for the name is kept in memory and marks the pod for
        :meth:`flush`, as a container recorded: lost to a crash, it is not
        known, so memsw is only raised. A changed ask is saved now, and the
        hook call answers once it landed (the save returned): the file may
        hold the older ask, which a restart would put back, taking swap
        kubelet asked for (rare: kubelet changes a container's swap seldom)."""
        if key not in self._pods:
            return None
        asked = self._swap.setdefault(key, {})
        before = asked.get(name)
        if before == swap:
            return None
        asked[name] = swap
        self._dirty.add(key)
        if before is None:  # (not in the file either: load() keeps every ask the file holds)
            return None
        return self._save(self._pods[key])

    def container_wanted(self, record: PodRecord, name: str) -> CgroupValues:
        """What the hook answers for container ``name`` (SpecError if the spec
        has none); on v1 its memsw as the runtime sets it from kubelet's ask
        (:meth:`note_swap`): equal to its memory limit for none (0), else the
        swap asked (-1: unlimited; never below the limit). With no ask known
        (none told, nor in the pod's file: an older version's file, a
        container the listing found, a first ask told after the last save
        before a crash), memsw is left as it is, but raised to a new limit above it
        (swap kubelet asked for never taken away)."""
        values = container_values(parse_spec(record.spec), name, self._config.cfs_quota_enabled)
        asked = self._swap.get(record.key, {}).get(name)
        if asked is None:
            return values
        if asked == 0 or rank(asked) < rank(values.memory_limit):
            return replace(values, memory_swap=values.memory_limit)
        return replace(values, memory_swap=asked)

    def apply(self, record: PodRecord, *, raise_only: bool = False, written: list[Change] | None = None) -> list[Change]:
        """``written``: appended to as each value lands (see :func:`.apply.apply_values`)."""
        return apply_values(self.cgroups.pod(record.cgroup_parent), self.wanted(record), raise_only=raise_only,
                            written=written)

    def pod_files(self, record: PodRecord, warn: Warn = _warn, **extra: object) -> CgroupFiles | None:
        """The pod cgroup's files; None, warned of, for a parent that maps to no
        cgroup: never writable, so the pod is not tracked (the reconcile loop
        would fail on it every pass)."""
        try:
            return self.cgroups.pod(record.cgroup_parent)
        except ValueError as exc:
            warn("batchresource cannot map the pod's cgroup parent to a cgroup; the pod is not tracked",
                 {"pod": record.pod, "cgroup_parent": record.cgroup_parent, "reason": str(exc), **extra})
            return None

    def write_pod(self, record: PodRecord, *, raise_only: bool, warn: Warn = _warn, **extra: object) -> None:
        """Write the pod cgroup's values (only the raising ones with ``raise_only``),
        logging each value written, those written before a failure too; a
        failure is warned of and left to the reconcile loop, which retries it
        (the pod still runs)."""
        changes: list[Change] = []
        try:
            self.apply(record, raise_only=raise_only, written=changes)
        except (OSError, ValueError) as exc:  # (SpecError and MemoryBelowUsage are ValueErrors)
            _log_pod_changes(record, changes, extra)
            warn("batchresource could not write the pod cgroup",
                 {"pod": record.pod, "cgroup_parent": record.cgroup_parent, "reason": str(exc), **extra})
            return
        _log_pod_changes(record, changes, extra)


def _log_pod_changes(record: PodRecord, changes: list[Change], extra: Mapping[str, object]) -> None:
    for change in changes:
        log.info("batchresource set a pod cgroup value",
                 extra={"pod": record.pod, "field": change.field.value, "old": change.old, "new": change.new, **extra})


def _forgotten(fields: dict[str, str], removed: Written) -> None:
    """A forgotten pod's line, once its file's removal has ended (its failure,
    or a bug's, logged by the writer's own callback, added first)."""
    landed = not removed.cancelled() and removed.exception() is None and removed.result() is None
    log.info("batchresource pod forgotten", extra={**fields, "state_file": "removed" if landed else "not removed"})


def _record(containers: set[ContainerKey], add: Iterable[ContainerKey], drop: Iterable[ContainerKey]) -> None:
    """``add`` into ``containers`` keeping one attempt per name (the highest), then ``drop``."""
    for name, attempt in add:
        recorded = [c for c in containers if c[0] == name]
        if any(a > attempt for _, a in recorded):
            continue  # (listed as it ended: the hook already answered its next attempt)
        containers.difference_update(recorded)
        containers.add((name, attempt))
    containers.difference_update(drop)
