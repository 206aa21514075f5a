"""CRI helpers for the integration tests, for both CRI v1 and v1alpha2.

Pod and container configs come from `runtimeproxy.host.crispec` (the benchmark
uses them too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from cri_api.v1alpha2 import api_pb2_grpc as v1alpha2_grpc


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
