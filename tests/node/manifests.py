"""The static pods of the node tier, as an operator would write them.

All host-network (there is no CNI here), busybox only, pulled never (the
images are imported), and a short grace period: busybox `sleep` as PID 1
ignores SIGTERM, so every stop would otherwise wait out the default 30 s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runtimeproxy.host.images import BUSYBOX_IMAGE

NAMESPACE = "rp-node"
SLEEP = ["sleep", "3600"]
GRACE_SECONDS = 1

# The limited container: kubelet turns these into the cgroup values below.
CPU_LIMIT, MEMORY_LIMIT = "250m", "64Mi"
CFS_QUOTA_US, CFS_PERIOD_US, MEMORY_LIMIT_BYTES = 25000, 100000, 64 * 1024 * 1024

# The BE pod's batch resources, which the batchresource hook applies (kubelet knows nothing of them).
BATCH_CPU_MILLI, BATCH_MEMORY = 500, "128Mi"
BATCH_CFS_QUOTA_US, BATCH_MEMORY_BYTES = 50000, 128 * 1024 * 1024


@dataclass(frozen=True)
class StaticPod:
    name: str
    containers: tuple[str, ...]
    init_containers: tuple[str, ...] = ()
    spec: dict[str, Any] | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None

    def pod_name(self, node: str) -> str:
        """kubelet names a static pod after its manifest's name and the node."""
        return f"{self.name}-{node}"

    def manifest(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": NAMESPACE, "labels": {"app": self.name, **(self.labels or {})}}
        if self.annotations:
            metadata["annotations"] = self.annotations
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": self.spec}

    def path(self, directory: Path) -> Path:
        return directory / f"{self.name}.yaml"

    def write(self, directory: Path) -> Path:
        """Written whole: kubelet ignores dot files, and a rename is atomic (a half-written
        manifest is rejected, and only retried at the next periodic check)."""
        path, staging = self.path(directory), directory / f".{self.name}.yaml"
        staging.write_text(yaml.safe_dump(self.manifest()))
        staging.replace(path)
        return path


def _container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": SLEEP, **extra}


def _spec(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"hostNetwork": True, "terminationGracePeriodSeconds": GRACE_SECONDS,
                            "containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return spec


# Probe errors count as failures: the threshold outlasts a proxy restart on a loaded machine.
LIVENESS = {"exec": {"command": ["true"]}, "periodSeconds": 3, "timeoutSeconds": 5, "failureThreshold": 10}

MULTI = StaticPod(
    "multi", ("app", "sidecar"), ("init",),
    _spec(_container("app"), _container("sidecar"),
          init=(_container("init", command=["sh", "-c", "echo initialised"]),)),
)
PROBED = StaticPod(
    "probed", ("main",),
    spec=_spec(_container("main", livenessProbe=LIVENESS)),
)
LIMITED = StaticPod(
    "limited", ("main",),
    spec=_spec(_container("main", resources={"limits": {"cpu": CPU_LIMIT, "memory": MEMORY_LIMIT}})),
)
DOOMED = StaticPod("doomed", ("main",), spec=_spec(_container("main")))
BATCH = StaticPod(
    "batch", ("main",), spec=_spec(_container("main")),
    labels={"koordinator.sh/qosClass": "BE"},
    annotations={"node.koordinator.sh/extended-resource-spec": json.dumps({"containers": {"main": {
        "requests": {"kubernetes.io/batch-cpu": str(BATCH_CPU_MILLI), "kubernetes.io/batch-memory": BATCH_MEMORY},
        "limits": {"kubernetes.io/batch-cpu": str(BATCH_CPU_MILLI), "kubernetes.io/batch-memory": BATCH_MEMORY},
    }}})},
)
PODS = (MULTI, PROBED, LIMITED, DOOMED, BATCH)
# Not of the tier's set: the pod test_runtime_back.py starts once the runtime is back.
AFTER_OUTAGE = StaticPod("after-outage", ("main",), spec=_spec(_container("main")))


def write_all(directory: Path) -> None:
    for pod in PODS:
        pod.write(directory)
