"""What a runtime's verbose status says of a container in its OCI spec: the
resources it runs with, and the pod cgroup parent it was put under."""

from __future__ import annotations

import posixpath
from typing import Any

from cri_api.hookapi import api_pb2 as hookapi

__all__ = ["cgroup_parent_from_path", "cgroup_parent_from_spec", "resources_from_spec"]


def resources_from_spec(spec: Any) -> hookapi.LinuxContainerResources:
    """The CRI view of an OCI runtime spec's Linux resources (what is set)."""
    out = hookapi.LinuxContainerResources()
    if not isinstance(spec, dict):
        return out
    resources = (spec.get("linux") or {}).get("resources") or {}
    cpu, memory = resources.get("cpu") or {}, resources.get("memory") or {}
    numbers = {
        "cpu_period": cpu.get("period"),
        "cpu_quota": cpu.get("quota"),
        "cpu_shares": cpu.get("shares"),
        "memory_limit_in_bytes": memory.get("limit"),
        "memory_swap_limit_in_bytes": memory.get("swap"),
        "oom_score_adj": (spec.get("process") or {}).get("oomScoreAdj"),
    }
    for name, value in numbers.items():
        if isinstance(value, int) and value > 0 or (name == "oom_score_adj" and isinstance(value, int)):
            setattr(out, name, value)
    for name, key in (("cpuset_cpus", "cpus"), ("cpuset_mems", "mems")):
        if isinstance(cpu.get(key), str):
            setattr(out, name, cpu[key])
    for limit in resources.get("hugepageLimits") or []:
        if isinstance(limit, dict) and isinstance(limit.get("limit"), int):
            out.hugepage_limits.add(page_size=str(limit.get("pageSize", "")), limit=limit["limit"])
    unified = resources.get("unified")
    if isinstance(unified, dict):
        out.unified.update({str(k): str(v) for k, v in unified.items()})
    return out


def cgroup_parent_from_spec(spec: Any, container_id: str, pod_parent: str) -> str:
    """The pod cgroup parent the runtime put the container under, read from its
    OCI spec's ``cgroupsPath`` (``cgroup_parent_from_path``)."""
    linux = spec.get("linux") if isinstance(spec, dict) else None
    path = linux.get("cgroupsPath") if isinstance(linux, dict) else None
    return cgroup_parent_from_path(path if isinstance(path, str) else "", container_id, pod_parent)


def cgroup_parent_from_path(path: str, container_id: str, pod_parent: str) -> str:
    """The pod cgroup parent the runtime put the container under, read from its
    cgroups path (containerd's ``slice:cri-containerd:<id>`` with systemd,
    ``<parent>/<id>`` with cgroupfs); ``pod_parent`` unless that says otherwise,
    and always when the pod has none."""
    if not path or not pod_parent:
        return pod_parent  # (a pod with none gets the runtime's own default, "/k8s.io": not a hook's doing)
    if ":" in path:  # systemd: containerd keeps only the parent's last slice
        parent_slice = path.split(":", 1)[0]
        same = posixpath.basename(pod_parent.rstrip("/")) == parent_slice
        return pod_parent if same or not parent_slice else parent_slice
    parent, _, name = path.rstrip("/").rpartition("/")
    if name != container_id or not parent or parent == pod_parent.rstrip("/"):
        return pod_parent
    return parent
