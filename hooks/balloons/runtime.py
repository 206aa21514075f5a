"""What the balloons hook asks of the runtime (CRI v1): which containers run
where (to rebuild assignments after a restart), which have exited (kubelet
keeps an exited container, e.g. a finished init container, until its pod
goes: no stop event comes for it), and moving a running container to its
balloon's new CPUs.

The endpoint is usually the proxy's own socket: an UpdateContainerResources
sent there passes through this hook's PreUpdateContainerResources, which
answers the same cpuset, so the proxy's merge keeps it.

A listing's calls, and a move's, all go through one channel: a reload that
retargets the client meanwhile ends them with
:class:`hooks.criclient.EndpointChanged` rather than sending the rest to
another runtime; the hook's stop, with :class:`hooks.criclient.ClientClosed`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import grpc

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.merge import merge_resources
from runtimeproxy.hookpath.runtimespec import resources_from_spec

from ..criclient import LIVE_STATES, Connection, CriClient, skips_hooks, verbose_info

from .balloon import ContainerKey
from .matching import PodContext
from .topology import parse_cpuset

log = logging.getLogger(__name__)

POD_UID_LABEL = "io.kubernetes.pod.uid"  # kubelet's label on each container
__all__ = ["POD_UID_LABEL", "ExitedContainer", "FoundContainer", "Listing", "RuntimeClient"]


@dataclass(frozen=True)
class FoundContainer:
    """A live container as the runtime reports it."""

    container_id: str
    key: ContainerKey
    pod: PodContext
    pod_uid: str
    cpus: frozenset[int]  # its cpuset now; empty if not pinned (or spec not known)
    mems: str
    shares: int
    # False if the runtime shows no spec (cri-dockerd has no runtimeSpec in its
    # ContainerStatus info): then cpus/mems say nothing of what it runs on.
    spec_known: bool = True
    # False for one created and not started yet (CONTAINER_CREATED): live, as
    # it is placed and moved as a running one is, but not running.
    running: bool = True
    # When it was created (CRI created_at, ns since the epoch; 0: not known):
    # a restart places those it has no saved balloon for, and reconcile
    # those it adopts, in this order (planning.creation_order), as they were
    # placed when created.
    created_at: int = 0


@dataclass(frozen=True)
class ExitedContainer:
    """A container the runtime lists as exited (its pod still there)."""

    container_id: str
    key: ContainerKey


@dataclass(frozen=True)
class Listing:
    """One ListPodSandbox + ListContainers round trip: the live containers
    (with their specs) and the exited ones (ids only, no ContainerStatus)."""

    live: list[FoundContainer]
    exited: list[ExitedContainer]


class RuntimeClient(CriClient):
    async def pod_containers(self, pod_uid: str, timeout: float) -> tuple[set[ContainerKey], list[ExitedContainer]]:
        """One pod's containers, by kubelet's label: the keys of the live ones
        and the exited ones. One ListContainers, no spec read."""
        stub = self._on(self._connect())
        request = v1.ListContainersRequest(filter=v1.ContainerFilter(label_selector={POD_UID_LABEL: pod_uid}))
        listed = await stub.ListContainers(request, timeout=timeout)
        live: set[ContainerKey] = set()
        exited = []
        for container in listed.containers:
            key = (pod_uid, container.metadata.name)
            if container.state == v1.CONTAINER_EXITED:
                exited.append(ExitedContainer(container.id, key))
            elif container.state in LIVE_STATES:
                live.add(key)
        return live, exited

    async def list_containers(self) -> Listing:
        """Every call on one endpoint: EndpointChanged if a reload retargets meanwhile."""
        connection = self._connect()
        answer = await self._on(connection).ListPodSandbox(v1.ListPodSandboxRequest(), timeout=self.timeout)
        pods = {p.id: p for p in answer.items}
        listed = await self._on(connection).ListContainers(v1.ListContainersRequest(), timeout=self.timeout)
        found = []
        exited = []
        for container in listed.containers:
            pod = pods.get(container.pod_sandbox_id)
            if pod is None or skips_hooks(pod.labels):
                continue
            if container.state == v1.CONTAINER_EXITED:
                exited.append(ExitedContainer(container.id, (pod.metadata.uid, container.metadata.name)))
                continue
            if container.state not in LIVE_STATES:
                continue
            try:
                spec = await self._spec(connection, container.id)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    continue  # removed meanwhile
                raise
            cpu = (((spec or {}).get("linux") or {}).get("resources") or {}).get("cpu") or {}
            try:
                cpus = parse_cpuset(str(cpu.get("cpus") or ""))
            except ValueError:
                cpus = frozenset()
            shares = cpu.get("shares")
            meta = pod.metadata
            found.append(
                FoundContainer(
                    container_id=container.id,
                    key=(meta.uid, container.metadata.name),
                    pod=PodContext(meta.namespace, meta.name, container.metadata.name, dict(pod.labels), dict(pod.annotations)),
                    pod_uid=meta.uid,
                    cpus=cpus,
                    mems=str(cpu.get("mems") or ""),
                    shares=shares if isinstance(shares, int) else 0,
                    spec_known=spec is not None,
                    running=container.state == v1.CONTAINER_RUNNING,
                    created_at=container.created_at,
                )
            )
        return Listing(found, exited)

    async def _spec(self, connection: Connection, container_id: str) -> dict[str, Any] | None:
        """The container's OCI spec from its verbose status; None if the runtime shows none."""
        status = await self._on(connection).ContainerStatus(
            v1.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=self.timeout
        )
        info = verbose_info(status.info) or {}
        spec = info.get("runtimeSpec")
        return spec if isinstance(spec, dict) else None

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        """Move a container to ``cpus``/``mems``, keeping its other resources as they are
        (read back from its spec, so that other hooks and the proxy's records see them whole).
        The spec is read from the endpoint the update goes to: EndpointChanged, unsent, if a
        reload retargets between the two."""
        connection = self._connect()
        resources = v1.LinuxContainerResources()
        merge_resources(resources, resources_from_spec(await self._spec(connection, container_id) or {}))
        resources.cpuset_cpus = cpus
        if mems:
            resources.cpuset_mems = mems
        await self._on(connection).UpdateContainerResources(
            v1.UpdateContainerResourcesRequest(container_id=container_id, linux=resources), timeout=self.timeout
        )
