"""The executors of the pod calls: RunPodSandbox, StopPodSandbox, RemovePodSandbox."""

from __future__ import annotations

from typing import Any

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1

from .executorbase import Executor, HookRequest, copied, opted_out
from .merge import merge_cgroup_parent, merge_map, merge_resources
from .store import StateStore, pod_record


class RunPodSandbox(Executor):
    request, response = v1.RunPodSandboxRequest, v1.RunPodSandboxResponse
    reads_response = True

    def key(self, req: v1.RunPodSandboxRequest) -> str:
        return req.config.metadata.uid

    def skips(self, req: v1.RunPodSandboxRequest, store: StateStore) -> bool:
        return opted_out(req.config.labels)

    def hook_request(self, req: v1.RunPodSandboxRequest, store: StateStore) -> HookRequest:
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
        changed = merge_cgroup_parent(config.linux, answer.cgroup_parent) or changed
        if answer.HasField("resources"):
            changed = merge_resources(config.linux.resources, answer.resources) or changed
        return changed

    def record(
        self, req: v1.RunPodSandboxRequest, resp: v1.RunPodSandboxResponse, store: StateStore,
        seen: HookRequest | None = None,
    ) -> bool:
        if not isinstance(seen, hookapi.PodSandboxHookRequest):
            seen = pod_record(req.config, req.runtime_handler)
        store.put_pod(resp.pod_sandbox_id, seen)
        return True


class StopPodSandbox(Executor):
    request, response = v1.StopPodSandboxRequest, v1.StopPodSandboxResponse
    ordered_until_issued = True

    def key(self, req: v1.StopPodSandboxRequest) -> str:
        return req.pod_sandbox_id

    def skips(self, req: v1.StopPodSandboxRequest, store: StateStore) -> bool | None:
        record = store.pods.get(req.pod_sandbox_id)
        return None if record is None else opted_out(record.labels)

    async def load(self, req: v1.StopPodSandboxRequest, store: StateStore) -> None:
        await store.pod(req.pod_sandbox_id)

    def hook_request(self, req: v1.StopPodSandboxRequest, store: StateStore) -> HookRequest | None:
        return copied(store.pods.get(req.pod_sandbox_id))

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        return not post or req.pod_sandbox_id in store.pods


class RemovePodSandbox(Executor):
    request, response = v1.RemovePodSandboxRequest, v1.RemovePodSandboxResponse

    def key(self, req: v1.RemovePodSandboxRequest) -> str:
        return req.pod_sandbox_id

    def record(self, req: v1.RemovePodSandboxRequest, resp: Any, store: StateStore, seen: Any = None) -> bool:
        store.drop_pod(req.pod_sandbox_id)
        return True

    async def unsure(self, req: v1.RemovePodSandboxRequest, store: StateStore) -> None:
        await store.forget_if_gone("pod", req.pod_sandbox_id)
