"""Builders for common CRI requests, for both CRI v1 and v1alpha2.

The two API versions share message names and field numbers, so every helper
takes the generated module (`cri_api.v1.api_pb2` or `cri_api.v1alpha2.api_pb2`)
and builds the same request with it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from cri_api.v1alpha2 import api_pb2_grpc as v1alpha2_grpc
from runtimeproxy.host.containerd import BUSYBOX_IMAGE


@dataclass(frozen=True)
class CriApi:
    """One CRI version: its messages module and its grpc module."""

    version: str
    pb: ModuleType
    grpc: ModuleType

    def runtime(self, channel: object):
        return self.grpc.RuntimeServiceStub(channel)

    def images(self, channel: object):
        return self.grpc.ImageServiceStub(channel)


V1 = CriApi("v1", v1, v1_grpc)
V1ALPHA2 = CriApi("v1alpha2", v1alpha2, v1alpha2_grpc)
APIS = (V1, V1ALPHA2)

# PID 1 ignores SIGTERM without a handler; the trap lets StopContainer end it at once.
SLEEP_COMMAND = ("/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait")


def host_network(pb: ModuleType):
    """Like kubelet for a hostNetwork pod: no CNI needed, own pid namespace per container."""
    return pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD)


def pod_sandbox_config(pb: ModuleType, log_directory: Path, *, name: str = "pod",
                       namespace: str = "runtime-proxy-test", cgroup_parent: str = "",
                       labels: dict[str, str] | None = None,
                       annotations: dict[str, str] | None = None):
    """A host-network PodSandboxConfig with a unique name and uid.

    `cgroup_parent` empty lets containerd place the pod under /k8s.io/<id>;
    pass e.g. "/kubepods/besteffort/pod<uid>" to mimic kubelet's cgroupfs layout.
    """
    uid = uuid.uuid4().hex
    unique = f"{name}-{uid[:8]}"
    log_directory = Path(log_directory) / unique
    log_directory.mkdir(parents=True, exist_ok=True)
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=unique, uid=uid, namespace=namespace, attempt=0),
        # No hostname: a host-network pod shares the host's UTS namespace (kubelet sets none either).
        log_directory=str(log_directory),
        labels=labels or {},
        annotations=annotations or {},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=host_network(pb),
            ),
        ),
    )


def container_config(pb: ModuleType, *, name: str = "sleeper", image: str = BUSYBOX_IMAGE,
                     command: tuple[str, ...] = SLEEP_COMMAND,
                     labels: dict[str, str] | None = None,
                     annotations: dict[str, str] | None = None,
                     resources=None):
    """A ContainerConfig running busybox (by default: sleep for an hour); logs to <name>.log."""
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name, attempt=0),
        image=pb.ImageSpec(image=image),
        command=list(command),
        log_path=f"{name}.log",
        labels=labels or {},
        annotations=annotations or {},
        linux=pb.LinuxContainerConfig(
            resources=resources,
            security_context=pb.LinuxContainerSecurityContext(
                namespace_options=host_network(pb),
            ),
        ),
    )


def verbose_info(status_response) -> dict:
    """The JSON `info` of a verbose ContainerStatus / PodSandboxStatus response."""
    return json.loads(status_response.info["info"])


def cgroup_v1_mount(controller: str) -> Path:
    """Where the cgroup v1 hierarchy of `controller` is mounted (cpu may share one with cpuacct)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, target, fstype, options, *_ = line.split()
        if fstype == "cgroup" and controller in options.split(","):
            return Path(target)
    raise LookupError(f"no cgroup v1 hierarchy for {controller}")


def cgroup_of(pid: int, controller: str = "cpu") -> Path:
    """The cgroup v1 directory of `pid` for `controller`, from /proc/<pid>/cgroup."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return cgroup_v1_mount(controller) / path.lstrip("/")
    raise LookupError(f"pid {pid} has no {controller} cgroup")
