"""Hook requests for tests of hook servers (the SDK, the test hook server).

A ``**kw`` is more fields of the request by name, each of its own type (the
message's constructor checks them).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType, Kind


def pod_request(**kw: Any) -> api_pb2.PodSandboxHookRequest:
    return api_pb2.PodSandboxHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="nginx", uid="uid-1", namespace="default", attempt=1),
        runtime_handler="runc",
        labels={"app": "nginx"},
        annotations={"anno": "1"},
        cgroup_parent="/kubepods/besteffort/poduid-1",
        **kw,
    )


def container_request(**kw: Any) -> api_pb2.ContainerResourceHookRequest:
    return api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name="nginx", uid="uid-1", namespace="default"),
        container_meta=api_pb2.ContainerMetadata(name="web", attempt=0, id="cid-1"),
        container_annotations={"c": "d"},
        container_resources=api_pb2.LinuxContainerResources(cpu_shares=1024, memory_limit_in_bytes=1 << 30),
        pod_labels={"app": "nginx"},
        container_envs={"PATH": "/bin"},
        **kw,
    )


def request_for(hook: HookType) -> Message:
    return pod_request() if HOOK_POINTS[hook].kind is Kind.POD else container_request()
