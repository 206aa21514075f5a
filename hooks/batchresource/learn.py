"""Learning the BE pods no hook call told of, from the runtime's listing.

Under the proxy's Ignore policy a BE pod whose sandbox and containers were
all made while the hook was down runs with kubelet's values, and no later
hook call need come for it. Each pass lists the runtime (:mod:`.runtime`)
and, for a ready BE pod the hook does not know, does what its hooks would
have done: saves its state file, raises the pod cgroup, writes each
container's cgroup the values PreCreateContainer would have answered, then
lowers the pod cgroup (raising pod first, lowering containers first, as the
hooks and the reconcile loop do: a parent is never left below its child).

A pod learned so is looked at again on later passes until each of its
containers has been written: one created but not started had no cgroup yet.
A listing that fails is logged when it starts failing and retried next pass.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc

from ..criclient import ClientClosed
from .apply import Change, MemoryBelowUsage, apply_values
from .pods import KnownPods
from .resources import container_values
from .runtime import ListedPod, RuntimeLister
from .spec import ANNOTATION_SPEC, SpecError, pod_spec
from .state import PodRecord

__all__ = ["LEARNED", "RuntimeLearner", "learn_loop"]

log = logging.getLogger("hooks.batchresource")

LEARNED = "batchresource learned a pod from the runtime"
_WHY = "a running BE pod no hook call told of (made while the hook was down, or not asked)"


@dataclass
class RuntimeLearner:
    pods: KnownPods
    lister: RuntimeLister
    cfs_quota_enabled: bool = True
    # Keys of the pods learned here with a container not written yet (no cgroup
    # yet: created, not started), looked at again next pass.
    waiting: set[str] = field(default_factory=set)
    # What was warned of, by sandbox id: said once, not every pass.
    _warned: dict[str, set[str]] = field(default_factory=dict)
    _failing: str | None = None

    async def pass_once(self) -> list[str]:
        """One listing; the keys of the pods learned by it. Never raises for the runtime's failures."""
        try:
            listed = await self.lister.be_pods(lambda key: key not in self.pods or key in self.waiting)
        except ClientClosed:
            return []  # the hook is stopping
        except grpc.aio.AioRpcError as exc:
            self._failed(f"{exc.code().name}: {exc.details()}")
            return []
        if self._failing is not None:
            log.info("batchresource lists the runtime's pods again",
                     extra={"runtime_endpoint": self.lister.endpoint, "was": self._failing})
            self._failing = None
        listed_ids = {p.sandbox_id for p in listed}
        self._warned = {sid: said for sid, said in self._warned.items() if sid in listed_ids}
        new, waiting = [], set()
        for pod in listed:
            learned, waits = self._take(pod)
            if learned:
                new.append(pod.key)
            if waits:
                waiting.add(pod.key)
        self.waiting = waiting
        return new

    def _failed(self, reason: str) -> None:
        level = logging.DEBUG if reason == self._failing else logging.WARNING
        log.log(level, "batchresource cannot list the runtime's pods; retrying next pass",
                extra={"runtime_endpoint": self.lister.endpoint, "reason": reason})
        self._failing = reason

    def _warn_once(self, pod: ListedPod, what: str, message: str, **extra: object) -> None:
        said = self._warned.setdefault(pod.sandbox_id, set())
        if what not in said:
            said.add(what)
            log.warning(message, extra={"pod": pod.pod, "pod_sandbox_id": pod.sandbox_id, **extra})

    def _take(self, pod: ListedPod) -> tuple[bool, bool]:
        """Do what the hooks would have done for ``pod``: whether the hook did
        not know it, and whether a container of it has no cgroup to write yet."""
        try:
            spec = pod_spec(pod.labels, pod.annotations)
        except SpecError as exc:
            self._warn_once(pod, "spec", "batchresource left a BE pod found in the runtime unchanged: malformed extended-resource-spec",
                            annotation=ANNOTATION_SPEC, reason=str(exc))
            return False, False
        if spec is None:
            return False, False
        if not pod.cgroup_parent:
            self._warn_once(pod, "parent", "batchresource left a BE pod found in the runtime unchanged: the runtime shows no cgroup_parent")
            return False, False
        record = PodRecord(pod.uid, pod.namespace, pod.name, pod.cgroup_parent, pod.annotations[ANNOTATION_SPEC])
        try:
            if not self.pods.cgroups.pod(record.cgroup_parent).exists():
                return False, False  # gone meanwhile, or not under this hook's cgroup_root
        except ValueError as exc:
            self._warn_once(pod, "parent", "batchresource cannot map the pod's cgroup parent to a cgroup; the pod is not tracked",
                            cgroup_parent=record.cgroup_parent, reason=str(exc))
            return False, False
        new = record.key not in self.pods
        if new:
            log.info(LEARNED, extra={"pod": pod.pod, "uid": pod.uid, "pod_sandbox_id": pod.sandbox_id,
                                     "cgroup_parent": pod.cgroup_parent, "containers": len(pod.containers), "reason": _WHY})
        # (A pod stopped since the listing is tracked again: the reconcile loop
        # forgets it once kubelet removes its cgroup, as for a stop it missed.)
        self.pods.remember(record)
        self._pod(pod, record, raise_only=True)
        waits = False
        for container in pod.containers:
            try:
                values = container_values(spec, container.name, self.cfs_quota_enabled)
                files = self.pods.cgroups.container(record.cgroup_parent, container.container_id)
                if not files.exists():
                    waits = True  # created, not started: no cgroup yet (next pass)
                    continue
                changes = apply_values(files, values)
            except (SpecError, MemoryBelowUsage, OSError, ValueError) as exc:
                self._warn_once(pod, container.container_id, "batchresource left a container found in the runtime unchanged",
                                container=container.name, container_id=container.container_id, reason=str(exc))
                continue
            _log_changes("batchresource set a container cgroup value", pod, changes,
                         container=container.name, container_id=container.container_id)
        self._pod(pod, record, raise_only=False)  # lowering: after the containers
        return new, waits

    def _pod(self, pod: ListedPod, record: PodRecord, *, raise_only: bool) -> None:
        try:
            changes = self.pods.apply(record, raise_only=raise_only)
        except (SpecError, MemoryBelowUsage, OSError, ValueError) as exc:  # the reconcile loop retries
            self._warn_once(pod, f"pod-{raise_only}", "batchresource could not write the pod cgroup",
                            cgroup_parent=record.cgroup_parent, reason=str(exc))
            return
        _log_changes("batchresource set a pod cgroup value", pod, changes)


def _log_changes(message: str, pod: ListedPod, changes: list[Change], **extra: object) -> None:
    for change in changes:
        log.info(message, extra={"pod": pod.pod, "field": change.field.value, "old": change.old, "new": change.new,
                                 "from": "runtime listing", **extra})


async def learn_loop(learner: RuntimeLearner, interval: float) -> None:
    """At start, then every ``interval``, beside the reconcile loop (a runtime slow
    to answer delays only this loop, not the pod cgroups' reconcile)."""
    try:
        while True:
            try:
                await learner.pass_once()
            except Exception:  # one bad pass must not end the loop
                log.exception("batchresource runtime listing pass failed")
            await asyncio.sleep(interval)
    finally:
        await learner.lister.close()
