"""``runtime-proxy hook run batchresource``: the hook server.

Container hooks answer the container's batch values (the runtime applies
them); PreRunPodSandbox writes the pod cgroup itself (kubelet created it
before RunPodSandbox) and answers the pod values too. Anything wrong with a
pod's spec is logged and the pod is left as it is: the hook never fails a pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2
from runtimeproxy.hookpath.points import HookType

from ..builtin import BuiltinHook
from .apply import MemoryBelowUsage, check_memory
from .config import BatchResourceConfig
from .learn import RuntimeLearner, learn_loop
from .pods import KnownPods
from .reconcile import reconcile_loop
from .resources import CgroupValues, container_values, pod_values
from .runtime import RuntimeLister
from .spec import ANNOTATION_SPEC, PodBatchSpec, SpecError, pod_spec
from .state import PodRecord, pod_key
from .writer import Written

__all__ = ["BatchResourceHook"]

log = logging.getLogger("hooks.batchresource")

_CONTAINER_REFUSALS = (SpecError, MemoryBelowUsage, ValueError, OSError)

# How long the stop waits for its last saves before it hands them back
# running (the lock kept until they end); below the SDK's release step bound.
STOP_SAVE_WAIT = 2.0


def _with_values(base: api_pb2.LinuxContainerResources, values: CgroupValues) -> api_pb2.LinuxContainerResources:
    out = api_pb2.LinuxContainerResources()
    out.CopyFrom(base)
    out.cpu_period = values.cpu_period
    out.cpu_quota = values.cpu_quota
    out.cpu_shares = values.cpu_shares
    out.memory_limit_in_bytes = values.memory_limit
    return out


async def _landed(written: Written | None) -> None:
    """Until a state file write has ended, landed or failed (its outcome is
    logged by KnownPods, never raised here: the call answers all the same).
    A call cut meanwhile (its deadline) leaves the write to land, in order:
    asyncio.wait cancels nothing it waits for."""
    if written is not None:
        await asyncio.wait({written})


def _pod_name(meta: api_pb2.PodSandboxMetadata) -> str:
    return f"{meta.namespace}/{meta.name}"


class BatchResourceHook(BuiltinHook):
    NAME: ClassVar[str] = "batchresource"
    SUMMARY: ClassVar[str] = "Koordinator batch-cpu/batch-memory of BE pods into container and pod cgroups"
    HOOKS: ClassVar[tuple[HookType, ...]] = (
        HookType.PRE_RUN_POD_SANDBOX,
        HookType.PRE_CREATE_CONTAINER,
        HookType.PRE_UPDATE_CONTAINER_RESOURCES,
        HookType.POST_STOP_POD_SANDBOX,
    )

    def __init__(self, socket_path: str, config: BatchResourceConfig | None = None, **kwargs: Any) -> None:
        super().__init__(socket_path, **kwargs)
        self.config = config or BatchResourceConfig()
        self.pods = KnownPods(self.config)
        self.learner = (
            RuntimeLearner(self.pods, RuntimeLister(self.config.runtime_endpoint), self.config.cfs_quota_enabled)
            if self.config.runtime_endpoint else None
        )

    @classmethod
    def from_config(cls, socket_path: str, config: Mapping[str, Any]) -> BatchResourceHook:
        return cls(socket_path, BatchResourceConfig.from_mapping(config))

    def _used_up(self) -> str | None:
        """A hook that lists the runtime (``runtime_endpoint`` set) and served
        is used once, as a BalloonsHook is: its stop closes the listing's
        channel for good, so a start again is a HookServerError (build a new
        one), not a hook serving that never learns from the runtime again. A
        start that failed closes it too (its release step), but the next
        start reopens it under the lock (:meth:`_before_serving`)."""
        closed = self.learner is not None and self.learner.lister.closed
        return "its runtime listing is closed" if closed else None

    async def _after_stop(self) -> None:
        """The runtime listing's channel closed (as balloons' stop closes its
        runtime client; for good once the hook served: :meth:`_used_up`) in
        :meth:`_before_release`, or here for a hook that never served. A
        listing still running gets ClientClosed, a pass that learns nothing."""
        if self.learner is not None:
            await self.learner.lister.close()

    async def _before_release(self) -> asyncio.Future[None] | None:
        """The server stopped (no answer comes any more: none saves a pod
        then), the socket's lock still held: the containers recorded since
        the last pass are saved now, and nothing is written or removed after
        (the listing's loop runs until ``hook run`` cancels it, after the
        stop): the next instance, waiting on the lock, reads them all, and
        no late write overwrites its files or brings back one it removed.
        The saves run in the state files' thread, after every write asked
        before them, started first and handed to the SDK at once
        (``_keep_lock_until``): the lock is kept until they (and so every
        earlier write) end even if what follows (the listing's close) is cut
        by the step's bound or a cancelled stop. Waited for at most what is
        left of ``STOP_SAVE_WAIT``; past it (a stalled disk) the stop ends,
        the lock kept until they end (``hooks.releasestep``)."""
        self.pods.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_SAVE_WAIT
        saving = self.pods.last_saves()
        self._keep_lock_until(saving)
        if self.learner is not None:
            await self.learner.lister.close()
        await asyncio.wait({saving}, timeout=max(0.0, deadline - loop.time()))
        if saving.done():
            return None
        log.warning("batchresource's last saves to its state directory took over %gs (a stalled disk?): the "
                    "socket's lock is kept until they end", STOP_SAVE_WAIT)
        return saving

    async def _before_serving(self) -> None:
        # The socket's lock is ours: no other instance writes the state dir now.
        # (Read off the loop; the listener opens only once it is read. A stop
        # during the read does not wait for it: the lock does, handed it.)
        await self.pods.load(self._keep_lock_until)
        # What a failed start's release step closed opens again now, not before
        # the lock: BuiltinHook._start refuses a start again of a hook that served.
        if self.learner is not None:
            self.learner.lister.reopen()

    async def background(self) -> None:
        config = self.config
        log.info(  # once at start: what an operator needs to tell what this hook writes, and where
            "batchresource settings",
            extra={
                "cgroup_root": str(config.cgroup_root),
                "cgroup_version": self.pods.cgroups.version,
                "cgroup_version_from": "config" if config.cgroup_version else "detected",
                "cgroup_driver": config.cgroup_driver.value,
                "state_dir": str(config.state_dir),
                "known_pods": len(self.pods.records()),
                "reconcile_interval": config.reconcile_interval,
                "cfs_quota_enabled": config.cfs_quota_enabled,
                "runtime_endpoint": config.runtime_endpoint,  # "": BE pods are learned from hook calls only
            },
        )
        # A TaskGroup: cancelling background() (``hook run`` does, after the
        # hook's stop) cancels and awaits both loops. The listing's channel is
        # the stop's to close (stop()): a listing under way then ends at once.
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(reconcile_loop(self.pods, config.reconcile_interval))
            if self.learner is not None:
                tasks.create_task(learn_loop(self.learner, config.reconcile_interval))

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        # A bug here must not fail pods (the hook may be registered with the Fail policy).
        try:
            return await super().handle(hook, request)
        except Exception:
            meta = getattr(request, "pod_meta", None)
            log.exception(
                "batchresource hook failed; the pod is left unchanged",
                extra={"hook": hook.value, "pod": _pod_name(meta) if meta is not None else ""},
            )
            return None

    # -- pod ---------------------------------------------------------------------

    def _spec(self, labels: Mapping[str, str], annotations: Mapping[str, str], pod: str, hook: HookType) -> PodBatchSpec | None:
        try:
            return pod_spec(labels, annotations)
        except SpecError as exc:
            log.warning(
                "batchresource left a BE pod unchanged: malformed extended-resource-spec",
                extra={"pod": pod, "hook": hook.value, "annotation": ANNOTATION_SPEC, "reason": str(exc)},
            )
            return None

    async def pre_run_pod_sandbox(self, request: api_pb2.PodSandboxHookRequest) -> api_pb2.PodSandboxHookResponse | None:
        pod = _pod_name(request.pod_meta)
        spec = self._spec(request.labels, request.annotations, pod, HookType.PRE_RUN_POD_SANDBOX)
        if spec is None:
            return None
        values = pod_values(spec, self.config.cfs_quota_enabled)
        if request.cgroup_parent:
            record = PodRecord(
                request.pod_meta.uid, request.pod_meta.namespace, request.pod_meta.name,
                request.cgroup_parent, request.annotations[ANNOTATION_SPEC],
            )
            await self._write_pod(record, raise_only=False)  # no container yet: any order is safe
        else:
            log.warning("batchresource BE pod has no cgroup_parent; only the runtime gets its values", extra={"pod": pod})
        return api_pb2.PodSandboxHookResponse(resources=_with_values(request.resources, values))

    async def _write_pod(self, record: PodRecord, *, raise_only: bool) -> None:
        """Write the pod cgroup, and save a pod new to the hook: the answer
        waits for its file (in the state files' thread, the loop free
        meanwhile), so a hook killed once it answered still knows the pod."""
        if self.pods.pod_files(record) is None:
            return
        saving = self.pods.remember(record)  # first: the reconcile loop retries what fails below
        self.pods.write_pod(record, raise_only=raise_only)
        await _landed(saving)

    async def post_stop_pod_sandbox(self, request: api_pb2.PodSandboxHookRequest) -> api_pb2.PodSandboxHookResponse | None:
        meta = request.pod_meta
        key = pod_key(meta.uid, meta.namespace, meta.name)
        if self.learner is not None:  # known or not: a listing under way must not take it up again
            self.learner.note_stopped(key)
        if key in self.pods:
            # Not waited for: a removal is a plain unlink (no directory fsync),
            # so a crash may leave the file all the same; a file left is
            # forgotten at the next start's reconcile pass, its cgroup gone.
            self.pods.forget(key, "PostStopPodSandbox")
        return None

    # -- containers ----------------------------------------------------------------

    async def pre_create_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return await self._container(request, HookType.PRE_CREATE_CONTAINER)

    async def pre_update_container_resources(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return await self._container(request, HookType.PRE_UPDATE_CONTAINER_RESOURCES)

    async def _container(self, request: api_pb2.ContainerResourceHookRequest, hook: HookType) -> api_pb2.ContainerResourceHookResponse | None:
        pod = _pod_name(request.pod_meta)
        spec = self._spec(request.pod_labels, request.pod_annotations, pod, hook)
        if spec is None:
            return None
        name, cid = request.container_meta.name, request.container_meta.id
        meta = request.pod_meta
        key = pod_key(meta.uid, meta.namespace, meta.name)
        # kubelet's swap, as the runtime applies it (the answer keeps it): the memsw the reconcile pass puts back
        swap = request.container_resources.memory_swap_limit_in_bytes
        try:
            values = container_values(spec, name, self.config.cfs_quota_enabled)
            if hook is HookType.PRE_UPDATE_CONTAINER_RESOURCES and cid and request.pod_cgroup_parent:
                files = self.pods.cgroups.container(request.pod_cgroup_parent, cid)
                if files.exists():
                    check_memory(files, values)
        except _CONTAINER_REFUSALS as exc:
            log.warning(
                "batchresource left a container unchanged",
                extra={"pod": pod, "container": name, "container_id": cid, "hook": hook.value, "reason": str(exc)},
            )
            # (An update answered "no change", its memory limit below the usage:
            # the runtime applies kubelet's values; the reconcile pass puts the
            # cpu values back and retries the memory limit.)
            await _landed(self.pods.note_swap(key, name, swap))
            return None
        if request.pod_cgroup_parent:
            # Pod first when raising; lowering the pod waits for the reconcile loop.
            record = PodRecord(meta.uid, meta.namespace, meta.name, request.pod_cgroup_parent, request.pod_annotations[ANNOTATION_SPEC])
            await self._write_pod(record, raise_only=True)
            await _landed(self.pods.note_swap(record.key, name, swap))  # (a changed ask: saved before the answer)
            if self.learner is not None:  # (no listing: nothing reads the list)
                # The runtime applies the answer: a container the listing leaves
                # alone. In memory; the listing's pass saves it, off the answer.
                self.pods.set_containers(record.key, add=[(name, request.container_meta.attempt)])
        log.info(
            "batchresource container values",
            extra={
                "pod": pod, "container": name, "hook": hook.value, "cpu_shares": values.cpu_shares,
                "cpu_quota": values.cpu_quota, "memory_limit": values.memory_limit,
            },
        )
        return api_pb2.ContainerResourceHookResponse(container_resources=_with_values(request.container_resources, values))
