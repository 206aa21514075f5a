"""What batchresource asks of the runtime (CRI v1): the running BE pods and
their live containers, to learn a pod no hook call told it of (one made
while the hook was down, under the proxy's Ignore policy).

The labels, annotations and cgroup parent are read from the sandbox's
verbose status, the config kubelet sent with RunPodSandbox: what the proxy
would have put in the PreRunPodSandbox request (``pod_record``). One listing
costs a ListPodSandbox, plus, only when a BE pod is to be looked at, one
ListContainers and a PodSandboxStatus per such pod; a ListContainers too
when a BE pod the hook knows is ready (to find a container of it made while
the hook was down). A pod whose status is no
longer ready (stopped meanwhile) is left out, as is one the runtime no longer
has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.store import config_from_info, pod_record

from ..criclient import LIVE_STATES, CriClient, skips_hooks, verbose_info
from .spec import ANNOTATION_SPEC, is_be_pod
from .state import ContainerKey, pod_key

__all__ = ["ListedContainer", "ListedPod", "Listing", "RuntimeLister", "wanted_by_hook"]


def wanted_by_hook(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """A pod batchresource's hooks act on: hooked by the proxy, BE, with a spec."""
    return not skips_hooks(labels) and is_be_pod(labels, annotations) and ANNOTATION_SPEC in annotations


@dataclass(frozen=True)
class ListedContainer:
    container_id: str
    name: str
    attempt: int
    state: int  # CRI's ContainerState: CONTAINER_CREATED (no cgroup yet) or CONTAINER_RUNNING

    @property
    def started(self) -> bool:
        return self.state != v1.CONTAINER_CREATED


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
    containers: tuple[ListedContainer, ...]  # the live ones (created or running)
    # (name, attempt) of every container the runtime lists for it, exited
    # ones too: a recorded attempt below one of these never comes back.
    attempts: frozenset[ContainerKey] = frozenset()

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def key(self) -> str:
        return pod_key(self.uid, self.namespace, self.name)


@dataclass(frozen=True)
class Listing:
    pods: list[ListedPod]  # the wanted ones, looked at closer
    ready: frozenset[str]  # the id of every ready sandbox listed, wanted or not
    # The ready BE pods ``known`` accepts, as ListPodSandbox shows them (no
    # status read: the hook has their config; cgroup_parent is "").
    known: list[ListedPod] = field(default_factory=list)


class RuntimeLister(CriClient):
    async def be_pods(self, wanted: Callable[[str, str], bool], known: Callable[[str, str], bool] = lambda _s, _k: False) -> Listing:
        """The ready BE pods ``wanted`` accepts (called with the sandbox id and
        the pod's key), with their live containers; those ``known`` accepts
        (and ``wanted`` does not) with their containers only. grpc's
        AioRpcError when the runtime fails a listing call (a pod removed or
        stopped between the calls is left out, not an error)."""
        connection = self._connect()
        ready = v1.PodSandboxFilter(state=v1.PodSandboxStateValue(state=v1.SANDBOX_READY))
        answer = await self._on(connection).ListPodSandbox(v1.ListPodSandboxRequest(filter=ready), timeout=self.timeout)
        ready_items = [p for p in answer.items if p.state == v1.SANDBOX_READY]  # (a runtime may not honour the filter)
        ready_ids = frozenset(p.id for p in ready_items)
        sandboxes, seen = [], []
        for p in ready_items:
            if not wanted_by_hook(p.labels, p.annotations):
                continue
            key = pod_key(p.metadata.uid, p.metadata.namespace, p.metadata.name)
            if wanted(p.id, key):
                sandboxes.append(p)
            elif known(p.id, key):
                seen.append(p)
        if not sandboxes and not seen:
            return Listing([], ready_ids)
        listed = await self._on(connection).ListContainers(v1.ListContainersRequest(), timeout=self.timeout)
        containers: dict[str, list[ListedContainer]] = {}
        attempts: dict[str, set[ContainerKey]] = {}
        for c in listed.containers:
            attempts.setdefault(c.pod_sandbox_id, set()).add((c.metadata.name, c.metadata.attempt))
            if c.state in LIVE_STATES:
                containers.setdefault(c.pod_sandbox_id, []).append(
                    ListedContainer(c.id, c.metadata.name, c.metadata.attempt, c.state))
        known_pods = [_listed_only(p, tuple(containers.get(p.id, ())), frozenset(attempts.get(p.id, ()))) for p in seen]
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
            if status.status.state != v1.SANDBOX_READY:
                continue  # stopped since ListPodSandbox: its cgroup goes, or is going
            found.append(_listed(sandbox, status, tuple(containers.get(sandbox.id, ()))))
        return Listing(found, ready_ids, known_pods)


def _listed_only(sandbox: v1.PodSandbox, containers: tuple[ListedContainer, ...],
                 attempts: frozenset[ContainerKey]) -> ListedPod:
    meta = sandbox.metadata
    return ListedPod(sandbox.id, meta.uid, meta.namespace, meta.name, dict(sandbox.labels),
                     dict(sandbox.annotations), "", containers, attempts)


def _listed(sandbox: v1.PodSandbox, status: v1.PodSandboxStatusResponse, containers: tuple[ListedContainer, ...]) -> ListedPod:
    config = config_from_info(verbose_info(status.info), v1.PodSandboxConfig())
    meta = sandbox.metadata
    if config is None:  # no verbose config (not containerd): the listing's labels, no cgroup parent
        return ListedPod(sandbox.id, meta.uid, meta.namespace, meta.name, dict(sandbox.labels),
                         dict(sandbox.annotations), "", containers)
    record = pod_record(config)  # what the proxy puts in the pod's hook requests
    return ListedPod(sandbox.id, meta.uid, meta.namespace, meta.name, dict(record.labels),
                     dict(record.annotations), record.cgroup_parent, containers)
