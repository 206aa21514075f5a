"""The CRI calls the hook-path component tests send, and what reached the fake runtime."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import RunningProxy

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
START = "/runtime.v1.RuntimeService/StartContainer"
RUN_POD = "/runtime.v1.RuntimeService/RunPodSandbox"
UPDATE = "/runtime.v1.RuntimeService/UpdateContainerResources"
REMOVE = "/runtime.v1.RuntimeService/RemoveContainer"
STOP = "/runtime.v1.RuntimeService/StopContainer"
STOP_POD = "/runtime.v1.RuntimeService/StopPodSandbox"
POD_STATUS = "/runtime.v1.RuntimeService/PodSandboxStatus"

QUOTA_HOOK = {
    "PreCreateContainer": {
        "container_resources": {"cpu_period": 100000, "cpu_quota": 20000, "memory_limit_in_bytes": 67108864},
        "container_annotations": {"hooked-by": "quota"},
        "container_envs": {"HOOKED": "1", "KEEP": "overridden"},
    }
}


def sandbox_config(**labels: str) -> v1.PodSandboxConfig:
    return v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name="web", uid="uid-1", namespace="default", attempt=0),
        labels={"app": "web", **labels},
        annotations={"pod-note": "x"},
        linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/poduid-1"),
    )


def create_request(**labels: str) -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=v1.ContainerConfig(
            metadata=v1.ContainerMetadata(name="app", attempt=1),
            image=v1.ImageSpec(image="busybox"),
            command=["sleep", "1"],
            envs=[v1.KeyValue(key="KEEP", value=b"original"), v1.KeyValue(key="RAW", value=b"\xff\xfe")],
            annotations={"c-note": "y"},
            linux=v1.LinuxContainerConfig(
                resources=v1.LinuxContainerResources(cpu_shares=256, memory_limit_in_bytes=1 << 30),
                security_context=v1.LinuxContainerSecurityContext(privileged=False, readonly_rootfs=True),
            ),
            mounts=[v1.Mount(container_path="/data", host_path="/srv/data", readonly=True)],
        ),
        sandbox_config=sandbox_config(**labels),
    )


def backend_request(fake: FakeBackend, path: str = CREATE, index: int = -1) -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest.FromString(fake.calls(path)[index].requests[0])


@contextlib.asynccontextmanager
async def records_kept(running: RunningProxy, sock_dir: Path, hook_dir: Path) -> AsyncIterator[None]:
    """A hook server on a point these calls never reach: the proxy records
    calls only while some hook server is registered (with none, the frames
    path relays them unrecorded)."""
    async with hook_server(sock_dir, "elsewhere", {"PreUpdateContainerResources": {}}) as hook:
        hook.register(hook_dir, ["PreUpdateContainerResources"])
        await registered(running, 1)
        yield
