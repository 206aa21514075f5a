"""What the balloons hook asks of the runtime (CRI v1): which containers run
where (to rebuild assignments after a restart), which have exited (kubelet
keeps an exited container, e.g. a finished init container, until its pod
goes: no stop event comes for it), and moving a running container to its
balloon's new CPUs.

The endpoint is usually the proxy's own socket: an UpdateContainerResources
sent there passes through this hook's PreUpdateContainerResources, which
answers the same cpuset, so the proxy's merge keeps it.

A listing's calls, and a move's, all go through one channel: a reload that
retargets the client meanwhile ends them with :class:`EndpointChanged`
rather than sending the rest to another runtime; the hook's stop, with
:class:`ClientClosed`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.hookpath.merge import merge_resources
from runtimeproxy.hookpath.runtimespec import resources_from_spec
from runtimeproxy.host.unixsocket import grpc_target

from .balloon import ContainerKey
from .config import PodContext
from .topology import parse_cpuset

log = logging.getLogger(__name__)

SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"  # pods the proxy never hooks
POD_UID_LABEL = "io.kubernetes.pod.uid"  # kubelet's label on each container
LIVE_STATES = (v1.CONTAINER_CREATED, v1.CONTAINER_RUNNING)


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


class EndpointChanged(Exception):
    """A reload changed runtimeEndpoint during a listing or a move. The calls
    made so far went to the old endpoint; the rest are not sent to the new
    one: a listing would pair one runtime's pods with another's containers, a
    move carry one's resources to the other."""


class ClientClosed(Exception):
    """The hook closed the client (it is stopping): no call is sent, and no
    channel opened again (it would never be closed)."""


@dataclass(frozen=True)
class _Connection:
    """One endpoint's channel; every call of one listing or move goes through one."""

    endpoint: str
    channel: aio.Channel
    stub: v1_grpc.RuntimeServiceStub


class RuntimeClient:
    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._connection: _Connection | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """close() was called: a call it cancelled is the hook stopping, not a failure."""
        return self._closed

    def _connect(self) -> _Connection:
        if self._closed:
            raise ClientClosed(f"the client of {self.endpoint} is closed")
        if self._connection is None:
            channel = aio.insecure_channel(grpc_target(self.endpoint))
            self._connection = _Connection(self.endpoint, channel, self._new_stub(channel))
        return self._connection

    def _new_stub(self, channel: aio.Channel) -> v1_grpc.RuntimeServiceStub:
        return v1_grpc.RuntimeServiceStub(channel)  # (tests answer with a stub of their own)

    def _on(self, connection: _Connection) -> v1_grpc.RuntimeServiceStub:
        """``connection``'s stub while it is the client's; EndpointChanged once
        retargeted, ClientClosed once closed."""
        if connection is not self._connection:
            if self._closed:
                raise ClientClosed(f"the client of {connection.endpoint} was closed")
            raise EndpointChanged(f"runtimeEndpoint changed from {connection.endpoint} to {self.endpoint}")
        return connection.stub

    async def retarget(self, endpoint: str) -> None:
        """Talk to ``endpoint`` from the next listing or move on (a reloaded config's)."""
        self.endpoint = endpoint
        await self._drop()

    async def close(self) -> None:
        """For good (the hook stops): every call from now on raises ClientClosed."""
        self._closed = True
        await self._drop()

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.channel.close()

    async def pod_containers(self, pod_uid: str, timeout: float) -> tuple[set[ContainerKey], list[ExitedContainer]]:
        """One pod's containers, by kubelet's label: the keys of the live ones
        and the exited ones. One ListContainers, no spec read."""
        stub = self._connect().stub
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

    async def list_live(self) -> list[FoundContainer]:
        return (await self.list_containers()).live

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
            if pod is None or pod.labels.get(SKIP_LABEL, "").lower() == "true":
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
                )
            )
        return Listing(found, exited)

    async def _spec(self, connection: _Connection, container_id: str) -> dict[str, Any] | None:
        """The container's OCI spec from its verbose status; None if the runtime shows none."""
        status = await self._on(connection).ContainerStatus(
            v1.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=self.timeout
        )
        try:
            info = json.loads(status.info.get("info", "") or "{}")
        except ValueError:
            return None
        spec = info.get("runtimeSpec") if isinstance(info, dict) else None
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
