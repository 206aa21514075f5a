"""What batchresource asks of the runtime (CRI v1): the running BE pods and
their live containers, to learn a pod no hook call told it of (one made
while the hook was down, under the proxy's Ignore policy).

The labels, annotations and cgroup parent are read from the sandbox's
verbose status, the config kubelet sent with RunPodSandbox: what the proxy
would have put in the PreRunPodSandbox request (``pod_record``). One listing
costs a ListPodSandbox, plus, only when a BE pod is to be looked at, one
ListContainers and a PodSandboxStatus per such pod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.store import config_from_info, pod_record

from ..criclient import LIVE_STATES, CriClient, skips_hooks, verbose_info
from .spec import ANNOTATION_SPEC, is_be_pod
from .state import pod_key

__all__ = ["ListedContainer", "ListedPod", "RuntimeLister", "wanted_by_hook"]


def wanted_by_hook(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """A pod batchresource's hooks act on: hooked by the proxy, BE, with a spec."""
    return not skips_hooks(labels) and is_be_pod(labels, annotations) and ANNOTATION_SPEC in annotations


@dataclass(frozen=True)
class ListedContainer:
    container_id: str
    name: str


@dataclass(frozen=True)
class ListedPod:
    """A ready BE pod as the runtime shows it, with what its hooks would have been told."""

    sandbox_id: str
    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    cgroup_parent: str  # "" when its config sets none, or the runtime shows no config
    containers: tuple[ListedContainer, ...]

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def key(self) -> str:
        return pod_key(self.uid, self.namespace, self.name)


class RuntimeLister(CriClient):
    async def be_pods(self, wanted: Callable[[str], bool]) -> list[ListedPod]:
        """The ready BE pods whose key ``wanted`` accepts, with their live containers.
        grpc's AioRpcError when the runtime fails a listing call (a pod removed
        between the calls is left out, not an error)."""
        connection = self._connect()
        ready = v1.PodSandboxFilter(state=v1.PodSandboxStateValue(state=v1.SANDBOX_READY))
        answer = await self._on(connection).ListPodSandbox(v1.ListPodSandboxRequest(filter=ready), timeout=self.timeout)
        sandboxes = [
            p for p in answer.items
            if p.state == v1.SANDBOX_READY  # (a runtime may not honour the filter)
            and wanted_by_hook(p.labels, p.annotations)
            and wanted(pod_key(p.metadata.uid, p.metadata.namespace, p.metadata.name))
        ]
        if not sandboxes:
            return []
        listed = await self._on(connection).ListContainers(v1.ListContainersRequest(), timeout=self.timeout)
        containers: dict[str, list[ListedContainer]] = {}
        for c in listed.containers:
            if c.state in LIVE_STATES:
                containers.setdefault(c.pod_sandbox_id, []).append(ListedContainer(c.id, c.metadata.name))
        found = []
        for sandbox in sandboxes:
            try:
                status = await self._on(connection).PodSandboxStatus(
                    v1.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id, verbose=True), timeout=self.timeout
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    continue  # removed meanwhile
                raise
            found.append(_listed(sandbox, status, tuple(containers.get(sandbox.id, ()))))
        return found


def _listed(sandbox: v1.PodSandbox, status: v1.PodSandboxStatusResponse, containers: tuple[ListedContainer, ...]) -> ListedPod:
    config = config_from_info(verbose_info(status.info), v1.PodSandboxConfig())
    meta = sandbox.metadata
    if config is None:  # no verbose config (not containerd): the listing's labels, no cgroup parent
        return ListedPod(sandbox.id, meta.uid, meta.namespace, meta.name, dict(sandbox.labels),
                         dict(sandbox.annotations), "", containers)
    record = pod_record(config)  # what the proxy puts in the pod's hook requests
    return ListedPod(sandbox.id, meta.uid, meta.namespace, meta.name, dict(record.labels),
                     dict(record.annotations), record.cgroup_parent, containers)
