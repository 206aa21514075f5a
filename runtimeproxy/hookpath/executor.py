"""RuntimeResourceExecutors: how each hooked CRI call reads and writes hooks.

One executor per CRI method. It names the key that orders calls on the same
object, builds the hook request (from the call, or from the store), applies a
hook's answer to the call, and records the outcome in the store. Which hook
points each method triggers is declared once, in :mod:`.points`; the table
:data:`HOOKED_METHODS` at the end joins the two.

Throughout, a record the store holds is taken from its dict, and read with
``store.container``/``store.pod`` only if it lacks one: no coroutine made
that would never await, at nearly every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1

from .merge import changed_from, clear_cpusets, emptied_cpusets, hook_resources, merge_env, merge_map, merge_resources
from .points import HookType, Phase, hook_for
from .store import StateStore, container_record, pod_record

# A pod with this label (a hook server's own pod) is never hooked, so a hook
# server running as a pod cannot deadlock its own start.
SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"

HookRequest = hookapi.PodSandboxHookRequest | hookapi.ContainerResourceHookRequest


def _skips(labels: Any) -> bool:
    return labels.get(SKIP_LABEL, "").lower() == "true"


def _copy(record: HookRequest | None) -> HookRequest | None:
    """A hook request from a stored record; hooks must not touch the store's copy."""
    if record is None:
        return None
    out = type(record)()
    out.CopyFrom(record)
    return out


class Executor:
    request: ClassVar[type[Message]]
    response: ClassVar[type[Message]]
    reads_response: ClassVar[bool] = False  # decode the backend's answer?
    # Calls on one object are serialised through the runtime call, except
    # these, which can take a whole grace period: the next call is issued
    # after them, but does not wait for them to end.
    ordered_until_issued: ClassVar[bool] = False
    # Recorded even while no hook server is registered, when the other calls
    # that keep state go by unrecorded: what it records (the resources) is
    # read back from the runtime only as its spec says, and a read under way
    # when it lands must be told it is stale.
    recorded_without_hooks: ClassVar[bool] = False
    # The hook point whose answers ``carry`` brings into this call: while any
    # hook server is registered (a pod moved by a server since removed still
    # takes its containers along), the call is decoded and carried before it
    # is sent, on either data path. With none, calls go as they came.
    carries_from: ClassVar[HookType | None] = None

    def key(self, req: Any) -> str:
        raise NotImplementedError

    async def carry(self, req: Any, store: StateStore, read_back: bool) -> bool:
        """Bring into the call what earlier hooks changed on its object that the
        client's copy lacks; True if it changed. Before this call's own hooks.
        ``read_back``: an object the records lack may be read from the runtime
        (else only the records count, and the call is not held for a read)."""
        return False

    async def skip(self, req: Any, store: StateStore) -> bool:
        return False

    async def hook_request(self, req: Any, store: StateStore) -> HookRequest | None:
        """The request hooks see, or None when there is nothing to hook."""
        return None

    def apply(self, req: Any, answer: Any, shown: Any = None, clear: tuple[str, ...] = ()) -> bool:
        """Merge one hook's answer into the CRI request; True if it changed. ``shown``: the hook
        request it answered, if known; ``clear``: the cpusets to empty (``emptied``'s, logged)."""
        return False

    def emptied(self, req: Any, answer: Any) -> tuple[str, ...]:
        """The cpusets of the request (``_resources``) that ``answer``, read whole, clears: only one with
        container_resources, as koord-runtime-proxy applies them (ChainCpusets.cleared judges the same)."""
        resources = self._resources(req)
        if resources is None or not answer.HasField("container_resources"):
            return ()
        return emptied_cpusets(resources, answer.container_resources)

    def _resources(self, req: Any) -> Any:
        return None  # the request's container resources, if it has any

    async def record(self, req: Any, resp: Any, store: StateStore, seen: HookRequest | None = None) -> None:
        """After a successful backend call. ``seen``: the hook request a pre
        hook was sent, if the call is still what it was built from (the
        executor's to keep: nothing else holds it)."""

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        """Whether ``record``, and ``hook_request`` for a post hook (``post``),
        end without reading the runtime: the client's answer need not wait for them."""
        return True

    def early_seen(self, req: Any, store: StateStore) -> HookRequest | None:
        """What ``record`` takes as ``seen``, built while the runtime works on
        a call no pre hook saw; None where the record needs nothing built or
        would read the runtime (that waits for the answer)."""
        return None

    async def unsure(self, req: Any, store: StateStore) -> None:
        """After a backend call whose outcome the proxy did not see (its client
        left, the runtime failed or went away): make the records true again."""


class _ContainerById(Executor):
    """Start/Stop/Remove: the hook request is the container's record."""

    def key(self, req: Any) -> str:
        return req.container_id

    async def skip(self, req: Any, store: StateStore) -> bool:
        record = store.containers.get(req.container_id) or await store.container(req.container_id)
        return record is not None and _skips(record.pod_labels)

    async def hook_request(self, req: Any, store: StateStore) -> HookRequest | None:
        return _copy(store.containers.get(req.container_id) or await store.container(req.container_id))

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        return not post or req.container_id in store.containers


class RunPodSandbox(Executor):
    request, response = v1.RunPodSandboxRequest, v1.RunPodSandboxResponse
    reads_response = True

    def key(self, req: v1.RunPodSandboxRequest) -> str:
        return req.config.metadata.uid

    async def skip(self, req: v1.RunPodSandboxRequest, store: StateStore) -> bool:
        return _skips(req.config.labels)

    async def hook_request(self, req: v1.RunPodSandboxRequest, store: StateStore) -> HookRequest:
        return pod_record(req.config, req.runtime_handler)

    def early_seen(self, req: v1.RunPodSandboxRequest, store: StateStore) -> HookRequest:
        return pod_record(req.config, req.runtime_handler)

    def apply(
        self, req: v1.RunPodSandboxRequest, answer: hookapi.PodSandboxHookResponse, shown: Any = None,
        clear: tuple[str, ...] = (),
    ) -> bool:
        config = req.config
        changed = merge_map(config.labels, answer.labels)
        changed = merge_map(config.annotations, answer.annotations) or changed
        if answer.cgroup_parent and answer.cgroup_parent != config.linux.cgroup_parent:
            config.linux.cgroup_parent = answer.cgroup_parent
            changed = True
        if answer.HasField("resources"):
            changed = merge_resources(config.linux.resources, answer.resources) or changed
        return changed

    async def record(
        self, req: v1.RunPodSandboxRequest, resp: v1.RunPodSandboxResponse, store: StateStore,
        seen: HookRequest | None = None,
    ) -> None:
        if not isinstance(seen, hookapi.PodSandboxHookRequest):
            seen = pod_record(req.config, req.runtime_handler)
        store.put_pod(resp.pod_sandbox_id, seen)


class StopPodSandbox(Executor):
    request, response = v1.StopPodSandboxRequest, v1.StopPodSandboxResponse
    ordered_until_issued = True

    def key(self, req: v1.StopPodSandboxRequest) -> str:
        return req.pod_sandbox_id

    async def skip(self, req: v1.StopPodSandboxRequest, store: StateStore) -> bool:
        record = store.pods.get(req.pod_sandbox_id) or await store.pod(req.pod_sandbox_id)
        return record is not None and _skips(record.labels)

    async def hook_request(self, req: v1.StopPodSandboxRequest, store: StateStore) -> HookRequest | None:
        return _copy(store.pods.get(req.pod_sandbox_id) or await store.pod(req.pod_sandbox_id))

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        return not post or req.pod_sandbox_id in store.pods


class RemovePodSandbox(Executor):
    request, response = v1.RemovePodSandboxRequest, v1.RemovePodSandboxResponse

    def key(self, req: v1.RemovePodSandboxRequest) -> str:
        return req.pod_sandbox_id

    async def record(self, req: v1.RemovePodSandboxRequest, resp: Any, store: StateStore, seen: Any = None) -> None:
        store.drop_pod(req.pod_sandbox_id)

    async def unsure(self, req: v1.RemovePodSandboxRequest, store: StateStore) -> None:
        await store.forget_if_gone("pod", req.pod_sandbox_id)


class CreateContainer(Executor):
    request, response = v1.CreateContainerRequest, v1.CreateContainerResponse
    reads_response = True
    carries_from = HookType.PRE_RUN_POD_SANDBOX

    async def carry(self, req: v1.CreateContainerRequest, store: StateStore, read_back: bool) -> bool:
        # containerd puts a container's cgroup under the cgroup parent of the
        # call's sandbox_config, kubelet's copy of the pod config: a pod that a
        # PreRunPodSandbox hook moved would have its containers left behind,
        # outside its pod-level limits. (Koordinator leaves them there.)
        pod = await store.pod(req.pod_sandbox_id) if read_back else store.pods.get(req.pod_sandbox_id)
        linux = req.sandbox_config.linux
        if pod is None or not pod.cgroup_parent or pod.cgroup_parent == linux.cgroup_parent:
            return False
        linux.cgroup_parent = pod.cgroup_parent
        return True

    def key(self, req: v1.CreateContainerRequest) -> str:
        return req.pod_sandbox_id

    async def skip(self, req: v1.CreateContainerRequest, store: StateStore) -> bool:
        return _skips(req.sandbox_config.labels)

    async def _record(
        self, req: v1.CreateContainerRequest, store: StateStore, container_id: str = ""
    ) -> hookapi.ContainerResourceHookRequest:
        # The pod as the runtime has it (with what PreRunPodSandbox hooks
        # changed), not kubelet's copy of its config.
        pod = store.pods.get(req.pod_sandbox_id) or await store.pod(req.pod_sandbox_id) or pod_record(req.sandbox_config)
        return _container_record(req, pod, container_id)

    async def hook_request(self, req: v1.CreateContainerRequest, store: StateStore) -> HookRequest:
        return await self._record(req, store)

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        return isinstance(seen, hookapi.ContainerResourceHookRequest) or req.pod_sandbox_id in store.pods

    def early_seen(self, req: v1.CreateContainerRequest, store: StateStore) -> HookRequest | None:
        pod = store.pods.get(req.pod_sandbox_id)
        return None if pod is None else _container_record(req, pod)

    def _resources(self, req: v1.CreateContainerRequest) -> v1.LinuxContainerResources:
        return req.config.linux.resources

    def apply(
        self, req: v1.CreateContainerRequest, answer: hookapi.ContainerResourceHookResponse, shown: Any = None,
        clear: tuple[str, ...] = (),
    ) -> bool:
        config = req.config
        changed = merge_map(config.annotations, answer.container_annotations)
        if answer.HasField("container_resources"):
            changed = merge_resources(config.linux.resources, answer.container_resources) or changed
            # The container is made without them (kubelet's cpuset cleared).
            changed = clear_cpusets(config.linux.resources, clear) or changed
        if answer.pod_cgroup_parent and answer.pod_cgroup_parent != req.sandbox_config.linux.cgroup_parent:
            # containerd places the container's cgroup under this parent.
            req.sandbox_config.linux.cgroup_parent = answer.pod_cgroup_parent
            changed = True
        return merge_env(config.envs, answer.container_envs) or changed

    async def record(
        self, req: v1.CreateContainerRequest, resp: v1.CreateContainerResponse, store: StateStore,
        seen: HookRequest | None = None,
    ) -> None:
        if isinstance(seen, hookapi.ContainerResourceHookRequest):
            seen.container_meta.id = resp.container_id
            record = seen
        else:
            record = await self._record(req, store, resp.container_id)
        store.put_container(resp.container_id, req.pod_sandbox_id, record)


def _container_record(
    req: v1.CreateContainerRequest, pod: hookapi.PodSandboxHookRequest, container_id: str = ""
) -> hookapi.ContainerResourceHookRequest:
    record = container_record(pod, req.config, container_id)
    if req.sandbox_config.linux.cgroup_parent:  # the cgroup parent the runtime will use for this container
        record.pod_cgroup_parent = req.sandbox_config.linux.cgroup_parent
    return record


class StartContainer(_ContainerById):
    request, response = v1.StartContainerRequest, v1.StartContainerResponse


class StopContainer(_ContainerById):
    request, response = v1.StopContainerRequest, v1.StopContainerResponse
    ordered_until_issued = True


class RemoveContainer(_ContainerById):
    request, response = v1.RemoveContainerRequest, v1.RemoveContainerResponse

    async def hook_request(self, req: Any, store: StateStore) -> HookRequest | None:
        return None

    async def skip(self, req: Any, store: StateStore) -> bool:
        return False

    async def record(self, req: v1.RemoveContainerRequest, resp: Any, store: StateStore, seen: Any = None) -> None:
        store.drop_container(req.container_id)

    async def unsure(self, req: v1.RemoveContainerRequest, store: StateStore) -> None:
        await store.forget_if_gone("container", req.container_id)


class UpdateContainerResources(_ContainerById):
    request, response = v1.UpdateContainerResourcesRequest, v1.UpdateContainerResourcesResponse
    recorded_without_hooks = True

    async def hook_request(self, req: v1.UpdateContainerResourcesRequest, store: StateStore) -> HookRequest | None:
        out = await super().hook_request(req, store)
        if out is None:
            return None
        if req.HasField("linux"):
            # As Koordinator shows it: the container's resources as they are
            # once the update applies (it sets only what it names).
            merge_resources(out.container_resources, hook_resources(req.linux))
        out.container_annotations.update(req.annotations)
        return out

    def _resources(self, req: v1.UpdateContainerResourcesRequest) -> v1.LinuxContainerResources:
        return req.linux

    def apply(
        self, req: v1.UpdateContainerResourcesRequest, answer: hookapi.ContainerResourceHookResponse, shown: Any = None,
        clear: tuple[str, ...] = (),
    ) -> bool:
        changed = merge_map(req.annotations, answer.container_annotations)
        if answer.HasField("container_resources"):
            update = answer.container_resources
            if isinstance(shown, hookapi.ContainerResourceHookRequest):
                # Only its changes: the values it was shown (the container's
                # own, say its swap limit) stay out of the update, as kubelet sent it.
                update = changed_from(shown.container_resources, update)
            changed = merge_resources(req.linux, update) or changed
            # The runtime keeps a cpuset an update leaves empty: kubelet's
            # dropped, the container keeps its own, as where
            # koord-runtime-proxy sent a whole answer's empty cpuset.
            changed = clear_cpusets(req.linux, clear) or changed
        return changed

    async def record(
        self, req: v1.UpdateContainerResourcesRequest, resp: Any, store: StateStore, seen: Any = None
    ) -> None:
        store.changed(req.container_id)
        record = store.containers.get(req.container_id)
        if record is None:  # read on demand later, updates included (runtime spec)
            return
        if req.HasField("linux"):
            # The runtime applies only what an update sets (a CPU manager's
            # cpuset-only update keeps the limits), as the read-back does.
            merge_resources(record.container_resources, hook_resources(req.linux))
        record.container_annotations.update(req.annotations)


@dataclass(frozen=True)
class HookedMethod:
    """A CRI method the hook stage decodes: its executor and its hook points."""

    method: str
    executor: Executor
    pre: HookType | None
    post: HookType | None
    keeps_state: bool  # its executor records calls (or re-checks them)


def _hooked(*executors: Executor) -> Mapping[str, HookedMethod]:
    table = {}
    for executor in executors:
        method = type(executor).__name__
        kind = type(executor)
        keeps_state = kind.record is not Executor.record or kind.unsure is not Executor.unsure
        table[method] = HookedMethod(
            method, executor, hook_for(method, Phase.PRE), hook_for(method, Phase.POST), keeps_state
        )
    return MappingProxyType(table)


# The CRI methods that go through the hook stage: those that trigger a hook
# point, and the removals that drop stored state.
HOOKED_METHODS: Mapping[str, HookedMethod] = _hooked(
    RunPodSandbox(),
    StopPodSandbox(),
    RemovePodSandbox(),
    CreateContainer(),
    StartContainer(),
    StopContainer(),
    RemoveContainer(),
    UpdateContainerResources(),
)
