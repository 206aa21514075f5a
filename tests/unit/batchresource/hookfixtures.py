"""A BatchResourceHook on a fake cgroup tree, and hook requests to call it with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cri_api.hookapi import api_pb2
from hooks.batchresource.config import BatchResourceConfig
from hooks.batchresource.server import BatchResourceHook

POD_PARENT = "/kubepods/besteffort/poduid-1"


def make_hook(tmp_path: Path, version: int = 1, **settings) -> BatchResourceHook:
    """No runtime listing unless asked (runtime_endpoint=...): these tests drive the hook calls."""
    settings.setdefault("runtime_endpoint", "")
    config = BatchResourceConfig(cgroup_root=tmp_path / "cgroup", cgroup_version=version, state_dir=tmp_path / "state", **settings)
    return BatchResourceHook(str(tmp_path / "hook.sock"), config)


async def restarted_hook(tmp_path: Path, version: int = 1, **settings) -> BatchResourceHook:
    """make_hook, its state dir read as its start reads it once it holds the socket's lock."""
    hook = make_hook(tmp_path, version, **settings)
    await hook.pods.load()
    return hook


def pod_request(labels: dict, annotations: dict, cgroup_parent: str = POD_PARENT, uid: str = "uid-1") -> api_pb2.PodSandboxHookRequest:
    return api_pb2.PodSandboxHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="batch-job", namespace="team-a", uid=uid),
        labels=labels,
        annotations=annotations,
        cgroup_parent=cgroup_parent,
    )


def container_request(
    labels: dict, annotations: dict, name: str = "main", cid: str = "", cgroup_parent: str = POD_PARENT,
    attempt: int = 0, **resources: Any
) -> api_pb2.ContainerResourceHookRequest:
    # resources: LinuxContainerResources fields by name (the int ones, cpu_shares and the like)
    return api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="batch-job", namespace="team-a", uid="uid-1"),
        container_meta=api_pb2.ContainerMetadata(name=name, id=cid, attempt=attempt),
        pod_labels=labels,
        pod_annotations=annotations,
        pod_cgroup_parent=cgroup_parent,
        container_resources=api_pb2.LinuxContainerResources(**resources),
    )
