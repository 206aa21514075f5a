"""Each executor's ``read_*`` answers as its plain method does once the record
is in the store: the same skip, hook request and record, whether the record
was held or read from the runtime. And a plain method answers at once only
what the reading one would (else it says it cannot: None, False)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.executor import HOOKED_METHODS
from runtimeproxy.hookpath.executorbase import SKIP_LABEL, Executor
from runtimeproxy.hookpath.store import StateStore, container_record, pod_record

POD, CONTAINER = "pod-1", "ctr-1"
POD_CONFIG = v1.PodSandboxConfig(
    metadata=v1.PodSandboxMetadata(name="web", uid="uid-1", namespace="default"),
    labels={SKIP_LABEL: "true", "app": "web"},  # opted out: a skip answered False at once is wrong
    annotations={"pod-note": "x"},
    linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/pod-uid-1"),
)
CONTAINER_CONFIG = v1.ContainerConfig(
    metadata=v1.ContainerMetadata(name="app", attempt=1),
    annotations={"c-note": "y"},
    linux=v1.LinuxContainerConfig(resources=v1.LinuxContainerResources(cpu_shares=512)),
)


def runtime_pod() -> hookapi.PodSandboxHookRequest:
    return pod_record(POD_CONFIG, "runc")


def runtime_container() -> hookapi.ContainerResourceHookRequest:
    return container_record(runtime_pod(), CONTAINER_CONFIG, CONTAINER)


class Runtime(StateStore):
    """A store whose runtime holds the pod and the container (read back on demand)."""

    async def _read_pod(self, pod_id: str) -> hookapi.PodSandboxHookRequest | None:
        return runtime_pod() if pod_id == POD else None

    async def _read_container(self, container_id: str) -> tuple[str, hookapi.ContainerResourceHookRequest] | None:
        return (POD, runtime_container()) if container_id == CONTAINER else None


async def no_backend(method: str, request: bytes) -> bytes:
    raise AssertionError("read through _read_pod/_read_container only")


def empty() -> Runtime:
    return Runtime(read_backend=no_backend)


def stored() -> StateStore:
    store = StateStore()
    store.put_pod(POD, runtime_pod())
    store.put_container(CONTAINER, POD, runtime_container())
    return store


def request(executor: Executor) -> Message:
    """A call on the pod or container the runtime holds, with what each kind carries."""
    fields = executor.request.DESCRIPTOR.fields_by_name
    req: Any = executor.request()
    if "pod_sandbox_id" in fields:
        req.pod_sandbox_id = POD
    if "container_id" in fields:
        req.container_id = CONTAINER
    if "config" in fields:
        req.config.CopyFrom(CONTAINER_CONFIG if isinstance(req, v1.CreateContainerRequest) else POD_CONFIG)
    if "sandbox_config" in fields:  # kubelet's copy: no cgroup parent a hook set
        req.sandbox_config.CopyFrom(POD_CONFIG)
        req.sandbox_config.linux.ClearField("cgroup_parent")
    if isinstance(req, v1.UpdateContainerResourcesRequest):
        req.linux.cpu_quota = 50_000
        req.annotations["updated"] = "1"
    return req


def response(executor: Executor) -> Message:
    resp: Any = executor.response()
    if "container_id" in executor.response.DESCRIPTOR.fields_by_name:
        resp.container_id = CONTAINER
    if "pod_sandbox_id" in executor.response.DESCRIPTOR.fields_by_name:
        resp.pod_sandbox_id = POD
    return resp


METHODS = sorted(HOOKED_METHODS)


@pytest.mark.parametrize("method", METHODS)
async def test_read_skips_answers_as_skips_with_the_record_stored(method: str) -> None:
    ex = HOOKED_METHODS[method].executor
    req = request(ex)
    want = bool(ex.skips(req, stored()))
    at_once = ex.skips(req, empty())
    assert at_once is None or at_once == want, "answered at once, yet not as with the record"
    assert await ex.read_skips(req, empty()) == want


@pytest.mark.parametrize("method", METHODS)
async def test_read_hook_request_answers_as_hook_request_with_the_record_stored(method: str) -> None:
    ex = HOOKED_METHODS[method].executor
    req = request(ex)
    want = ex.hook_request(req, stored())
    at_once = ex.hook_request(req, empty())
    assert at_once is None or at_once == want, "answered at once, yet not as with the record"
    assert await ex.read_hook_request(req, empty()) == want


@pytest.mark.parametrize("method", METHODS)
async def test_read_record_records_as_record_with_the_record_stored(method: str) -> None:
    ex = HOOKED_METHODS[method].executor
    req, resp = request(ex), response(ex)
    want = stored()
    assert ex.record(req, resp, want) is True
    store = empty()
    if not ex.record(req, resp, store):
        await ex.read_record(req, resp, store)
        assert (store.pods, store.containers) == (want.pods, want.containers)
