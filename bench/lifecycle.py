"""CRI work for the benchmark: the 100-container fixture and the timed pod lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.hookpath.store import container_record, pod_record
from runtimeproxy.host.crispec import container_config, pod_sandbox_config

_T = TypeVar("_T")

STEPS = (
    "RunPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
)
CALL_TIMEOUT = 60.0
NAMESPACE = "runtime-proxy-bench"

# What kubelet-made pods and containers roughly carry, so hook requests have a realistic size.
POD_LABELS = {"app": "bench", "pod-template-hash": "6d4cf56db6", "io.kubernetes.pod.namespace": NAMESPACE}
POD_ANNOTATIONS = {"kubernetes.io/config.seen": "2024-01-01T00:00:00.000000000Z", "kubernetes.io/config.source": "api"}
CONTAINER_ANNOTATIONS = {
    "io.kubernetes.container.hash": "3c5d4a1e",
    "io.kubernetes.container.restartCount": "0",
    "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
    "io.kubernetes.container.terminationMessagePolicy": "File",
    "io.kubernetes.pod.terminationGracePeriod": "30",
}


def container_resources() -> v1.LinuxContainerResources:
    # 500m CPU limit, 512 shares, 256 MiB: what kubelet derives from a small Burstable pod.
    return v1.LinuxContainerResources(cpu_period=100000, cpu_quota=50000, cpu_shares=512,
                                      memory_limit_in_bytes=256 * 1024 * 1024, oom_score_adj=999)


def bench_pod_config(log_dir: Path, name: str) -> v1.PodSandboxConfig:
    return pod_sandbox_config(v1, log_dir, name=name, namespace=NAMESPACE, labels=dict(POD_LABELS),
                              annotations=dict(POD_ANNOTATIONS))


def bench_container_config(name: str, *, resources: bool = True) -> v1.ContainerConfig:
    return container_config(v1, name=name, labels={"io.kubernetes.container.name": name},
                            annotations=dict(CONTAINER_ANNOTATIONS),
                            resources=container_resources() if resources else None)


def hook_request(log_dir: Path) -> hookapi.ContainerResourceHookRequest:
    """The PreCreateContainerHook request the proxy builds for a lifecycle's container."""
    pod = bench_pod_config(log_dir, "hookrtt")
    config = bench_container_config("sleeper")
    config.envs.add(key="GOMAXPROCS", value=b"1")  # bytes in this generated CRI module
    return container_record(pod_record(pod), config)


async def populate(stub: v1_grpc.RuntimeServiceStub, log_dir: Path, *, pods: int, containers: int,
                   parallel: int = 4) -> list[str]:
    """Run `pods` host-network sandboxes and create (not start) `containers` containers among them."""
    sandboxes = []
    for i in range(pods):
        config = bench_pod_config(log_dir, f"fixture{i}")
        resp = await stub.RunPodSandbox(v1.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
        sandboxes.append((resp.pod_sandbox_id, config))
    gate = asyncio.Semaphore(parallel)

    async def create(i: int) -> None:
        pod_id, pod_config = sandboxes[i % len(sandboxes)]
        async with gate:
            await stub.CreateContainer(
                v1.CreateContainerRequest(pod_sandbox_id=pod_id, config=bench_container_config(f"c{i:03d}"),
                                          sandbox_config=pod_config),
                timeout=CALL_TIMEOUT)

    await asyncio.gather(*(create(i) for i in range(containers)))
    return [pod_id for pod_id, _ in sandboxes]


@dataclass
class LifecycleResult:
    total: float  # seconds
    steps: dict[str, float] = field(default_factory=dict)


class LifecycleError(RuntimeError):
    def __init__(self, step: str, err: aio.AioRpcError) -> None:
        super().__init__(f"{step}: {err.code().name}: {err.details()}")
        self.step = step


async def lifecycle(stub: v1_grpc.RuntimeServiceStub, cleanup_stub: v1_grpc.RuntimeServiceStub,
                    log_dir: Path, name: str) -> LifecycleResult:
    """The seven calls of one pod with one container, each timed; the pod is removed even on failure
    (through `cleanup_stub`, i.e. directly at containerd)."""
    clock = time.perf_counter
    steps: dict[str, float] = {}
    pod_config = bench_pod_config(log_dir, name)
    pod_id = ""
    step = STEPS[0]

    async def timed(step_name: str, coro: Awaitable[_T]) -> _T:
        nonlocal step
        step = step_name
        t0 = clock()
        resp = await coro
        steps[step_name] = clock() - t0
        return resp

    started = clock()
    try:
        resp = await timed("RunPodSandbox", stub.RunPodSandbox(
            v1.RunPodSandboxRequest(config=pod_config), timeout=CALL_TIMEOUT))
        pod_id = resp.pod_sandbox_id
        created = await timed("CreateContainer", stub.CreateContainer(
            v1.CreateContainerRequest(pod_sandbox_id=pod_id, config=bench_container_config("sleeper"),
                                      sandbox_config=pod_config), timeout=CALL_TIMEOUT))
        cid = created.container_id
        await timed("StartContainer", stub.StartContainer(
            v1.StartContainerRequest(container_id=cid), timeout=CALL_TIMEOUT))
        await timed("StopContainer", stub.StopContainer(
            v1.StopContainerRequest(container_id=cid, timeout=10), timeout=CALL_TIMEOUT))
        await timed("RemoveContainer", stub.RemoveContainer(
            v1.RemoveContainerRequest(container_id=cid), timeout=CALL_TIMEOUT))
        await timed("StopPodSandbox", stub.StopPodSandbox(
            v1.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=CALL_TIMEOUT))
        await timed("RemovePodSandbox", stub.RemovePodSandbox(
            v1.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=CALL_TIMEOUT))
        pod_id = ""
    except aio.AioRpcError as err:
        raise LifecycleError(step, err) from err
    finally:
        if pod_id:  # failed half-way: leave nothing behind
            with contextlib.suppress(aio.AioRpcError):
                await cleanup_stub.StopPodSandbox(v1.StopPodSandboxRequest(pod_sandbox_id=pod_id),
                                                  timeout=CALL_TIMEOUT)
                await cleanup_stub.RemovePodSandbox(v1.RemovePodSandboxRequest(pod_sandbox_id=pod_id),
                                                    timeout=CALL_TIMEOUT)
    return LifecycleResult(total=clock() - started, steps=steps)
