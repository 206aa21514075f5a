"""Pod and container configs for busybox pods on the private containerd, in CRI v1 or v1alpha2.

The two API versions share message names and field numbers, so every builder
takes the generated module (`cri_api.v1.api_pb2` or `cri_api.v1alpha2.api_pb2`)
and builds the same config with it. The integration tests and the benchmark
both make their pods with these.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from types import ModuleType

from .images import BUSYBOX_IMAGE

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
