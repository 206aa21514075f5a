"""Learning the BE pods no hook call told of, from the runtime's listing.

Under the proxy's Ignore policy a BE pod whose sandbox and containers were
all made while the hook was down runs with kubelet's values, and no later
hook call need come for it. Each pass lists the runtime (:mod:`.runtime`)
and, for a ready BE pod the hook does not know, does what its hooks would
have done: saves its state file, raises the pod cgroup, writes each
container's cgroup the values PreCreateContainer would have answered, then
lowers the pod cgroup (raising pod first, lowering containers first, as the
hooks and the reconcile loop do: a parent is never left below its child).

A pod learned so is looked at again on later passes while a container of
it is waiting: one created but not started (no cgroup yet), or one whose
batch memory limit is below what it uses now (nothing written, retried). A
pod the listing cannot take (malformed spec, no or unmappable cgroup parent,
no pod cgroup under cgroup_root) is warned of once and its sandbox not looked
at again: neither its config nor its parent can change. A pod PostStopPodSandbox
was called for during a pass is not taken up by that pass. A listing that
fails is logged when it starts failing and retried next pass. An answer
that comes once the hook stopped (:meth:`KnownPods.close`) writes nothing.

A pod the hook knows is looked at for its containers only (the pass's one
ListContainers, no status): a live container the state does not list (see
:mod:`.state`) was made without the hook (under Ignore, while it was down)
and gets, in the same order, the values its hooks would have set, is
recorded, and is logged once. A container the state lists is not written
here (the hook set its values): the reconcile pass puts back a value another
writer changed, on the ids each pass tells it (:meth:`KnownPods.set_owned`).
One attempt per name is kept (:meth:`KnownPods.set_containers`):
a recorded container is dropped once a higher attempt of its name is
recorded, or listed in any state (kubelet made it again: that attempt never
comes back); one not listed stays, as it may not be created yet (the hook
answered, CreateContainer not done), until its pod goes. A container whose
name the spec does not have is left alone (the hook refuses it too). The
changed lists are saved once per pod, at the end of the pass
(:meth:`KnownPods.flush`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import grpc

from ..criclient import ClientClosed
from .apply import Change, MemoryBelowUsage, apply_values, check_memory
from .pods import KnownPods
from .resources import container_values
from .runtime import ListedContainer, ListedPod, RuntimeLister
from .spec import ANNOTATION_SPEC, PodBatchSpec, SpecError, parse_spec, pod_spec
from .state import PodRecord

__all__ = ["LEARNED", "UNTOLD", "RuntimeLearner", "learn_loop"]

log = logging.getLogger("hooks.batchresource")

LEARNED = "batchresource learned a pod from the runtime"
_WHY = "a running BE pod no hook call told of (made while the hook was down, or not asked)"
_FROM = "runtime listing"
UNTOLD = "batchresource set a container no hook call told of"
_UNTOLD_WHY = "a container of a known BE pod made while the hook was down (or not asked)"
ADOPTED = "batchresource took a known pod's running containers as set by the hook"


@dataclass
class RuntimeLearner:
    pods: KnownPods
    lister: RuntimeLister
    cfs_quota_enabled: bool = True
    # Keys of the pods learned here with a container waiting (created, not
    # started; or its memory above its batch limit), looked at again next pass.
    waiting: set[str] = field(default_factory=set)
    # Sandboxes the listing cannot take, never looked at closer again; an id
    # goes once its sandbox is no longer listed ready.
    refused: set[str] = field(default_factory=set)
    # Keys PostStopPodSandbox was called for since this pass began: a pod
    # stopped after the listing saw it ready is not taken up again.
    _stopped: set[str] = field(default_factory=set)
    # What was warned of, by sandbox id: said once, not every pass.
    _warned: dict[str, set[str]] = field(default_factory=dict)
    _failing: str | None = None

    def note_stopped(self, key: str) -> None:
        """PostStopPodSandbox for ``key`` (known to the hook or not)."""
        self._stopped.add(key)
        self.waiting.discard(key)

    def _wanted(self, sandbox_id: str, key: str) -> bool:
        if sandbox_id in self.refused or key in self._stopped:
            return False
        return key not in self.pods or key in self.waiting

    def _known(self, sandbox_id: str, key: str) -> bool:
        return key in self.pods and key not in self._stopped

    async def pass_once(self) -> list[str]:
        """One listing; the keys of the pods learned by it. Never raises for the runtime's failures."""
        # (A stop noted before this pass shows in its listing: PostStopPodSandbox
        # comes after the runtime stopped the sandbox. The uid may get a new
        # sandbox later.)
        self._stopped = set()
        try:
            return await self._pass()
        finally:  # (the hook's answers recorded since the last pass too)
            # In the state files' thread, in order with the hook calls'
            # saves and removals (.writer); the pass ends once they landed,
            # so a stalled disk holds the listing, not the loop.
            self.pods.flush()
            await self.pods.settled()

    async def _pass(self) -> list[str]:
        try:
            listing = await self.lister.be_pods(self._wanted, self._known)
        except ClientClosed:
            return []  # the hook is stopping
        except grpc.aio.AioRpcError as exc:
            self._failed(f"{exc.code().name}: {exc.details()}")
            return []
        if self.pods.closed:  # stopped while the listing was awaited: the next instance writes the cgroups now
            return []
        if self._failing is not None:
            log.info("batchresource lists the runtime's pods again",
                     extra={"runtime_endpoint": self.lister.endpoint, "was": self._failing})
            self._failing = None
        self.refused &= listing.ready
        self._warned = {sid: said for sid, said in self._warned.items() if sid in listing.ready}
        new, waiting = [], set()
        for pod in listing.pods:
            if pod.key in self._stopped:
                continue  # stopped while the listing was awaited
            learned, waits = self._take(pod)
            if learned:
                new.append(pod.key)
            if waits:
                waiting.add(pod.key)
        self.waiting = waiting
        by_key: dict[str, list[ListedPod]] = {}
        for pod in listing.known:  # (a pod's sandbox made again: its old one may still be ready)
            by_key.setdefault(pod.key, []).append(pod)
        for key, sandboxes in by_key.items():
            self._check_known(key, sandboxes)
        self._note_owned([*listing.pods, *listing.known])
        return new

    def _note_owned(self, listed: Iterable[ListedPod]) -> None:
        """Tell the reconcile pass which running containers' values are the
        hook's: those recorded now (a container left waiting, or made without
        the hook and not written, is not; one created, not started, has no
        cgroup yet)."""
        owned: dict[str, dict[str, str]] = {}
        for pod in listed:
            recorded = self.pods.containers(pod.key) or frozenset()
            owned.setdefault(pod.key, {}).update(
                {c.container_id: c.name for c in pod.containers if c.started and (c.name, c.attempt) in recorded})
        self.pods.set_owned(owned)

    def _check_known(self, key: str, sandboxes: list[ListedPod]) -> None:
        """A known pod's containers: record what was set, drop what is gone, and
        write (and record) those made without the hook."""
        record = self.pods.record(key)
        if record is None or key in self._stopped:
            return  # stopped or forgotten while the listing was awaited
        try:
            spec = parse_spec(record.spec)
        except SpecError:
            return  # (the reconcile loop warns of it)
        # (A name the spec lacks: the hook refused it, and so would this.)
        live = {(c.name, c.attempt): (pod, c) for pod in sandboxes for c in pod.containers if spec.has(c.name)}
        recorded = self.pods.containers(key)
        if recorded is None:  # its state file predates the list: what runs now is taken as the hook's
            self.pods.set_containers(key, add=live, adopt=True)
            log.info(ADOPTED, extra={"pod": record.pod, "uid": record.uid, "containers": len(live),
                                     "reason": "its state file lists no containers (written by an older version)"})
            return
        # Only a higher attempt listed (in any state: a container in
        # CrashLoopBackOff, an init container, is seldom seen live) drops
        # one: a recorded container not listed may be one the hook answered
        # whose CreateContainer is not done yet (dropped, the next pass
        # would take it as made without the hook and overwrite another
        # writer's values).
        latest: dict[str, int] = {}
        for name, attempt in (*recorded, *(a for pod in sandboxes for a in pod.attempts)):
            latest[name] = max(attempt, latest.get(name, attempt))
        superseded = {(name, attempt) for name, attempt in recorded if attempt < latest[name]}
        if superseded:
            self.pods.set_containers(key, drop=superseded)
        # Untold: not recorded, and not below a recorded attempt (one listed
        # as it ends, whose next attempt the hook answered already).
        untold = [(pod, c) for (name, attempt), (pod, c) in live.items()
                  if (name, attempt) not in recorded and attempt >= latest[name]]
        self._write_containers(sandboxes[0], record, spec, untold, tell=True)

    def _write_containers(self, pod: ListedPod, record: PodRecord, spec: PodBatchSpec,
                          containers: Iterable[tuple[ListedPod, ListedContainer]], *, tell: bool,
                          pod_anyway: bool = False) -> bool:
        """Write and record ``containers`` (their names the spec's: another is
        refused by the hook too, so left alone, unwarned) between raising the
        pod cgroup and lowering it, as the hooks and the reconcile loop do;
        whether one of them is waiting. With none, the pod only with
        ``pod_anyway`` (a pod taken up: its cgroup is the hooks' too)."""
        wanted = [(p, c) for p, c in containers if spec.has(c.name)]
        if not wanted and not pod_anyway:
            return False
        self._write_pod(pod, record, raise_only=True)
        waits = False
        for sandbox, container in wanted:
            waits |= self._container(sandbox, record, spec, container, tell=tell)
        self._write_pod(pod, record, raise_only=False)  # lowering: after the containers
        return waits

    def _failed(self, reason: str) -> None:
        level = logging.DEBUG if reason == self._failing else logging.WARNING
        log.log(level, "batchresource cannot list the runtime's pods; retrying next pass",
                extra={"runtime_endpoint": self.lister.endpoint, "reason": reason})
        self._failing = reason

    def _warn_once(self, pod: ListedPod, what: str, message: str, fields: Mapping[str, object]) -> None:
        said = self._warned.setdefault(pod.sandbox_id, set())
        if what not in said:
            said.add(what)
            log.warning(message, extra={"pod": pod.pod, "pod_sandbox_id": pod.sandbox_id, **fields})

    def _refuse(self, pod: ListedPod, message: str, fields: Mapping[str, object]) -> tuple[bool, bool]:
        """Warned of here, once: the sandbox is never looked at closer again."""
        self.refused.add(pod.sandbox_id)
        log.warning(message, extra={"pod": pod.pod, "pod_sandbox_id": pod.sandbox_id, **fields})
        return False, False

    def _take(self, pod: ListedPod) -> tuple[bool, bool]:
        """Do what the hooks would have done for ``pod``: whether the hook did
        not know it, and whether a container of it is waiting."""
        try:
            spec = pod_spec(pod.labels, pod.annotations)
        except SpecError as exc:
            return self._refuse(pod, "batchresource left a BE pod found in the runtime unchanged: malformed extended-resource-spec",
                                {"annotation": ANNOTATION_SPEC, "reason": str(exc)})
        if spec is None:  # (its config says not BE, unlike the listing's labels)
            self.refused.add(pod.sandbox_id)
            return False, False
        if not pod.cgroup_parent:
            return self._refuse(pod, "batchresource left a BE pod found in the runtime unchanged: the runtime shows no cgroup_parent", {})
        record = PodRecord(pod.uid, pod.namespace, pod.name, pod.cgroup_parent, pod.annotations[ANNOTATION_SPEC])
        files = self.pods.pod_files(record, lambda message, fields: self._refuse(pod, message, fields))
        if files is None:
            return False, False
        if not files.exists():
            return self._refuse(pod, "batchresource left a BE pod found in the runtime unchanged: no pod cgroup under cgroup_root",
                                {"cgroup_parent": record.cgroup_parent, "cgroup": str(files.relative)})
        new = record.key not in self.pods
        if new:
            log.info(LEARNED, extra={"pod": pod.pod, "uid": pod.uid, "pod_sandbox_id": pod.sandbox_id,
                                     "cgroup_parent": pod.cgroup_parent, "containers": len(pod.containers), "reason": _WHY})
        self.pods.remember(record)
        recorded = self.pods.containers(record.key) or frozenset()
        untold = [(pod, c) for c in pod.containers if (c.name, c.attempt) not in recorded]
        return new, self._write_containers(pod, record, spec, untold, tell=not new, pod_anyway=True)

    def _write_pod(self, pod: ListedPod, record: PodRecord, *, raise_only: bool) -> None:
        def warn(message: str, fields: Mapping[str, object]) -> None:
            self._warn_once(pod, f"pod-{raise_only}", message, fields)

        self.pods.write_pod(record, raise_only=raise_only, warn=warn, **{"from": _FROM})

    def _container(self, pod: ListedPod, record: PodRecord, spec: PodBatchSpec, container: ListedContainer,
                   *, tell: bool) -> bool:
        """Write one container's cgroup and record it (logged with ``tell``: its
        pod was known before); whether it is waiting (looked at again next pass)."""
        names = {"container": container.name, "container_id": container.container_id}
        try:
            values = container_values(spec, container.name, self.cfs_quota_enabled)
            files = self.pods.cgroups.container(record.cgroup_parent, container.container_id)
            if not files.exists():
                if not container.started:
                    return True  # created, not started: no cgroup yet (next pass)
                self._warn_once(pod, container.container_id, "batchresource left a running container found in the runtime "
                                "unchanged: it has no cgroup under cgroup_root", {**names, "cgroup": str(files.relative)})
                return False
            check_memory(files, values)  # before any write: all of its values or none
            changes = apply_values(files, values)
        except MemoryBelowUsage as exc:
            self._warn_once(pod, f"memory-{container.container_id}", "batchresource left a container found in the runtime "
                            "unchanged for now: it uses more memory than its batch limit; retried next pass",
                            {**names, "reason": str(exc)})
            return True
        except (SpecError, OSError, ValueError) as exc:
            self._warn_once(pod, container.container_id, "batchresource left a container found in the runtime unchanged",
                            {**names, "reason": str(exc)})
            return False
        self.pods.set_containers(record.key, add=[(container.name, container.attempt)])
        if tell:
            log.info(UNTOLD, extra={"pod": pod.pod, "uid": pod.uid, "pod_sandbox_id": pod.sandbox_id, **names,
                                    "attempt": container.attempt, "from": _FROM, "reason": _UNTOLD_WHY})
        _log_changes("batchresource set a container cgroup value", pod, changes, **names)
        return False


def _log_changes(message: str, pod: ListedPod, changes: list[Change], **extra: object) -> None:
    for change in changes:
        log.info(message, extra={"pod": pod.pod, "field": change.field.value, "old": change.old, "new": change.new,
                                 "from": _FROM, **extra})


async def learn_loop(learner: RuntimeLearner, interval: float) -> None:
    """At start, then every ``interval``, beside the reconcile loop (a runtime slow
    to answer delays only this loop, not the pod cgroups' reconcile). The
    lister's channel is the hook's to close, in its stop's last step under the
    socket's lock (BatchResourceHook._before_release; its stop for a hook
    that never served)."""
    while True:
        try:
            await learner.pass_once()
        except Exception:  # one bad pass must not end the loop
            log.exception("batchresource runtime listing pass failed")
        await asyncio.sleep(interval)
