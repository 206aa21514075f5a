"""A CRI runtime stub for the batchresource listing: pods and containers as
containerd lists them, each sandbox's verbose status with its config."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from hooks.batchresource.runtime import RuntimeLister

from .hookfixtures import POD_PARENT


def rpc_error(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details)


@dataclass
class FakePod:
    id: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    cgroup_parent: str = POD_PARENT
    name: str = "batch-job"
    namespace: str = "team-a"
    state: v1.PodSandboxState = v1.SANDBOX_READY
    containers: dict[str, str] = field(default_factory=dict)  # id -> name
    container_state: v1.ContainerState = v1.CONTAINER_RUNNING
    container_states: dict[str, v1.ContainerState] = field(default_factory=dict)  # id -> state, else container_state
    attempts: dict[str, int] = field(default_factory=dict)  # id -> attempt, else 0

    def metadata(self) -> v1.PodSandboxMetadata:
        return v1.PodSandboxMetadata(name=self.name, namespace=self.namespace, uid=self.uid)


class FakeRuntimeStub:
    def __init__(self, *pods: FakePod) -> None:
        self.pods = list(pods)
        self.calls: list[str] = []
        self.fail_with: aio.AioRpcError | None = None
        # Run once, inside the named call (after the runtime read its answer):
        # what kubelet or the proxy does while the listing awaits it.
        self.during: dict[str, Callable[[], Awaitable[None]]] = {}
        self.not_found: set[str] = set()  # sandbox ids PodSandboxStatus says NOT_FOUND for
        self.listed = asyncio.Event()  # set by each ListPodSandbox; the test clears it to wait for the next

    async def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_with is not None:
            raise self.fail_with
        if (meanwhile := self.during.pop(name, None)) is not None:
            await meanwhile()

    async def ListPodSandbox(self, request: v1.ListPodSandboxRequest, timeout: float | None = None) -> v1.ListPodSandboxResponse:
        items = [v1.PodSandbox(id=p.id, metadata=p.metadata(), state=p.state, labels=p.labels, annotations=p.annotations)
                 for p in self.pods]
        await self._call("ListPodSandbox")
        self.listed.set()
        return v1.ListPodSandboxResponse(items=items)

    async def ListContainers(self, request: v1.ListContainersRequest, timeout: float | None = None) -> v1.ListContainersResponse:
        containers = [
            v1.Container(id=cid, pod_sandbox_id=p.id, metadata=v1.ContainerMetadata(name=name, attempt=p.attempts.get(cid, 0)),
                         state=p.container_states.get(cid, p.container_state))
            for p in self.pods for cid, name in p.containers.items()
        ]
        await self._call("ListContainers")
        return v1.ListContainersResponse(containers=containers)

    async def PodSandboxStatus(self, request: v1.PodSandboxStatusRequest, timeout: float | None = None) -> v1.PodSandboxStatusResponse:
        pod = next((p for p in self.pods if p.id == request.pod_sandbox_id), None)
        await self._call("PodSandboxStatus")
        if pod is None or pod.id in self.not_found:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, f"no sandbox {request.pod_sandbox_id}")
        config: dict[str, Any] = {  # containerd's Go JSON of the RunPodSandbox config
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "labels": pod.labels, "annotations": pod.annotations, "linux": {"cgroup_parent": pod.cgroup_parent},
        }
        return v1.PodSandboxStatusResponse(
            status=v1.PodSandboxStatus(id=pod.id, metadata=pod.metadata(), state=pod.state),
            info={"info": json.dumps({"config": config, "runtimeHandler": ""})} if request.verbose else {},
        )


class FakeLister(RuntimeLister):
    def __init__(self, stub: FakeRuntimeStub) -> None:
        super().__init__("/fake/runtime.sock")
        self.stub = stub

    def _new_stub(self, channel: Any) -> Any:
        return self.stub
