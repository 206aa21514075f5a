"""What the runtime holds for kubelet's pods, read over CRI at containerd itself (never
through the proxy, so the tests' own reads neither load nor depend on it)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc

from .manifests import NAMESPACE

T = TypeVar("T")
_CALL_TIMEOUT = 10.0
POD_LOGS = Path("/var/log/pods")
CONTAINER_LOGS = Path("/var/log/containers")

RUNNING = v1.ContainerState.CONTAINER_RUNNING
EXITED = v1.ContainerState.CONTAINER_EXITED
SANDBOX_READY = v1.PodSandboxState.SANDBOX_READY
SANDBOX_NOTREADY = v1.PodSandboxState.SANDBOX_NOTREADY


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    attempt: int
    state: int

    @property
    def running(self) -> bool:
        return self.state == RUNNING


@dataclass(frozen=True)
class Pod:
    """A pod as the runtime holds it: its newest sandbox and that sandbox's containers."""

    name: str
    uid: str
    sandbox_id: str
    sandbox_ready: bool
    containers: dict[str, Container]

    def running(self, names: tuple[str, ...]) -> bool:
        return self.sandbox_ready and all(n in self.containers and self.containers[n].running for n in names)

    def stopped(self) -> bool:
        return not self.sandbox_ready and not any(c.running for c in self.containers.values())


async def pods(channel: aio.Channel) -> dict[str, Pod]:
    """The node tier's pods by pod name (the newest sandbox of each, as kubelet sees it)."""
    stub = v1_grpc.RuntimeServiceStub(channel)
    selector = {"io.kubernetes.pod.namespace": NAMESPACE}
    sandboxes = (await stub.ListPodSandbox(v1.ListPodSandboxRequest(
        filter=v1.PodSandboxFilter(label_selector=selector)), timeout=_CALL_TIMEOUT)).items
    containers = (await stub.ListContainers(v1.ListContainersRequest(
        filter=v1.ContainerFilter(label_selector=selector)), timeout=_CALL_TIMEOUT)).containers
    newest: dict[str, v1.PodSandbox] = {}
    for sandbox in sandboxes:
        name = sandbox.metadata.name
        if name not in newest or sandbox.created_at > newest[name].created_at:
            newest[name] = sandbox
    found = {}
    for name, sandbox in newest.items():
        own: dict[str, Container] = {}
        for c in sorted((c for c in containers if c.pod_sandbox_id == sandbox.id), key=lambda c: c.created_at):
            own[c.metadata.name] = Container(c.id, c.metadata.name, c.metadata.attempt, c.state)  # newest wins
        found[name] = Pod(name, sandbox.metadata.uid, sandbox.id, sandbox.state == SANDBOX_READY, own)
    return found


async def container_pid(channel: aio.Channel, container_id: str) -> int:
    """The container's process, from containerd's verbose status."""
    status = await v1_grpc.RuntimeServiceStub(channel).ContainerStatus(
        v1.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=_CALL_TIMEOUT)
    return int(json.loads(status.info["info"])["pid"])


async def wait_for(what: str, probe: Callable[[], Awaitable[T | None]], timeout: float, interval: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last state seen."""
    last: object = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                last = await probe()
                if last:
                    return last
                await asyncio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout}s") from None


async def remove_all_pods(channel: aio.Channel) -> None:
    """Stop and remove every pod of the tier (kubelet is gone by then, so nothing recreates them)."""
    stub = v1_grpc.RuntimeServiceStub(channel)
    selector = {"io.kubernetes.pod.namespace": NAMESPACE}
    listed = await stub.ListPodSandbox(v1.ListPodSandboxRequest(
        filter=v1.PodSandboxFilter(label_selector=selector)), timeout=_CALL_TIMEOUT)
    for sandbox in listed.items:
        for call, request in ((stub.StopPodSandbox, v1.StopPodSandboxRequest),
                              (stub.RemovePodSandbox, v1.RemovePodSandboxRequest)):
            try:
                await call(request(pod_sandbox_id=sandbox.id), timeout=_CALL_TIMEOUT * 3)
            except aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise


def remove_pod_logs(node_name: str) -> list[Path]:
    """kubelet's fixed log paths: the entries of this node's pods (their names hold the node
    name), and the directories themselves if nothing else is left in them. What was removed."""
    removed = []
    for directory in (POD_LOGS, CONTAINER_LOGS):
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if node_name in entry.name:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry)
        try:
            directory.rmdir()  # kubelet made it; gone only if no one else uses it
        except OSError:
            pass
    return removed
