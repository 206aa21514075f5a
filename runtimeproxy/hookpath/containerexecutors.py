"""The executors of the container calls: CreateContainer, Start/Stop/RemoveContainer, UpdateContainerResources."""

from __future__ import annotations

from typing import Any

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1

from .executorbase import Executor, HookRequest, copied, opted_out
from .merge import changed_from, clear_cpusets, hook_resources, merge_cgroup_parent, merge_env, merge_map, merge_resources
from .points import HookType
from .store import StateStore, container_record, pod_record


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

    def skips(self, req: v1.CreateContainerRequest, store: StateStore) -> bool:
        return opted_out(req.sandbox_config.labels)

    async def load(self, req: v1.CreateContainerRequest, store: StateStore) -> None:
        # The pod as the runtime has it (with what PreRunPodSandbox hooks
        # changed), not kubelet's copy of its config.
        await store.pod(req.pod_sandbox_id)

    def hook_request(self, req: v1.CreateContainerRequest, store: StateStore) -> HookRequest | None:
        pod = store.pods.get(req.pod_sandbox_id)
        return None if pod is None else _container_record(req, pod)

    async def read_hook_request(self, req: v1.CreateContainerRequest, store: StateStore) -> HookRequest:
        await self.load(req, store)
        # A pod the runtime has no record of either: kubelet's copy of its config.
        return self.hook_request(req, store) or _container_record(req, pod_record(req.sandbox_config))

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        return isinstance(seen, hookapi.ContainerResourceHookRequest) or req.pod_sandbox_id in store.pods

    def early_seen(self, req: v1.CreateContainerRequest, store: StateStore) -> HookRequest | None:
        return self.hook_request(req, store)

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
        changed = merge_cgroup_parent(req.sandbox_config.linux, answer.pod_cgroup_parent) or changed
        return merge_env(config.envs, answer.container_envs) or changed

    def record(
        self, req: v1.CreateContainerRequest, resp: v1.CreateContainerResponse, store: StateStore,
        seen: HookRequest | None = None,
    ) -> bool:
        if isinstance(seen, hookapi.ContainerResourceHookRequest):
            seen.container_meta.id = resp.container_id
            record = seen
        else:
            pod = store.pods.get(req.pod_sandbox_id)
            if pod is None:
                return False
            record = _container_record(req, pod, resp.container_id)
        store.put_container(resp.container_id, req.pod_sandbox_id, record)
        return True

    async def read_record(
        self, req: v1.CreateContainerRequest, resp: v1.CreateContainerResponse, store: StateStore,
        seen: HookRequest | None = None,
    ) -> None:
        await self.load(req, store)
        if not self.record(req, resp, store, seen):  # a pod the runtime has no record of either
            record = _container_record(req, pod_record(req.sandbox_config), resp.container_id)
            store.put_container(resp.container_id, req.pod_sandbox_id, record)


def _container_record(
    req: v1.CreateContainerRequest, pod: hookapi.PodSandboxHookRequest, container_id: str = ""
) -> hookapi.ContainerResourceHookRequest:
    record = container_record(pod, req.config, container_id)
    if req.sandbox_config.linux.cgroup_parent:  # the cgroup parent the runtime will use for this container
        record.pod_cgroup_parent = req.sandbox_config.linux.cgroup_parent
    return record


class _ContainerById(Executor):
    """Start/Stop/Remove: the hook request is the container's record."""

    def key(self, req: Any) -> str:
        return req.container_id

    def skips(self, req: Any, store: StateStore) -> bool | None:
        record = store.containers.get(req.container_id)
        return None if record is None else opted_out(record.pod_labels)

    async def load(self, req: Any, store: StateStore) -> None:
        await store.container(req.container_id)

    def hook_request(self, req: Any, store: StateStore) -> HookRequest | None:
        return copied(store.containers.get(req.container_id))

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        return not post or req.container_id in store.containers


class StartContainer(_ContainerById):
    request, response = v1.StartContainerRequest, v1.StartContainerResponse


class StopContainer(_ContainerById):
    request, response = v1.StopContainerRequest, v1.StopContainerResponse
    ordered_until_issued = True


class RemoveContainer(_ContainerById):
    request, response = v1.RemoveContainerRequest, v1.RemoveContainerResponse

    async def load(self, req: Any, store: StateStore) -> None:
        pass  # nothing it answers needs a record: no hook is sent, and its record is dropped

    def hook_request(self, req: Any, store: StateStore) -> HookRequest | None:
        return None

    def skips(self, req: Any, store: StateStore) -> bool:
        return False

    def record(self, req: v1.RemoveContainerRequest, resp: Any, store: StateStore, seen: Any = None) -> bool:
        store.drop_container(req.container_id)
        return True

    async def unsure(self, req: v1.RemoveContainerRequest, store: StateStore) -> None:
        await store.forget_if_gone("container", req.container_id)


class UpdateContainerResources(_ContainerById):
    request, response = v1.UpdateContainerResourcesRequest, v1.UpdateContainerResourcesResponse
    recorded_without_hooks = True

    def hook_request(self, req: v1.UpdateContainerResourcesRequest, store: StateStore) -> HookRequest | None:
        return _updated(req, super().hook_request(req, store))

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

    def record(self, req: v1.UpdateContainerResourcesRequest, resp: Any, store: StateStore, seen: Any = None) -> bool:
        store.changed(req.container_id)
        record = store.containers.get(req.container_id)
        if record is None:  # read on demand later, updates included (runtime spec)
            return True
        if req.HasField("linux"):
            # The runtime applies only what an update sets (a CPU manager's
            # cpuset-only update keeps the limits), as the read-back does.
            merge_resources(record.container_resources, hook_resources(req.linux))
        record.container_annotations.update(req.annotations)
        return True


def _updated(req: v1.UpdateContainerResourcesRequest, out: HookRequest | None) -> HookRequest | None:
    """The container's record as Koordinator shows it to an update's hooks."""
    if out is None:
        return None
    if req.HasField("linux"):
        # The container's resources as they are once the update applies (it sets only what it names).
        # (out is a container's record: the update's own hook_request made it)
        merge_resources(out.container_resources, hook_resources(req.linux))  # type: ignore[union-attr]
    out.container_annotations.update(req.annotations)  # type: ignore[union-attr]  # (as above)
    return out
