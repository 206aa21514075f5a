"""When the hook stage lets the runtime's answer go to the client as it
arrives (``cripath.stage.answer_at_once``): only when what it does after
the answer cannot read the runtime (``Executor.records_at_once``)."""

from __future__ import annotations

from typing import Any

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.stage import HookStage

from .test_sends_unchanged import IGNORE, _server, _stage

POD, CONTAINER = "pod-1", "ctr-1"


class _Context:
    """Records whether, and before which send, the stage let its answer go."""

    def __init__(self, request_sent: bool) -> None:
        self.request_sent = request_sent
        self.events: list[str] = []

    def answer_at_once(self, ready: Any) -> None:
        self.ready = ready

    def at_once(self) -> bool:
        """What the data path would do once the runtime answered."""
        return self.ready()

    async def abort(self, code: Any, details: str = "") -> None:
        raise AssertionError(f"aborted: {code} {details}")


def _stored(stage: HookStage, pod: bool, container: bool) -> None:
    if pod:
        stage.store.put_pod(POD, hookapi.PodSandboxHookRequest(pod_meta=hookapi.PodSandboxMetadata(uid="u1")))
    if container:
        stage.store.put_container(CONTAINER, POD, hookapi.ContainerResourceHookRequest())


REQUESTS = {
    "RunPodSandbox": (v1.RunPodSandboxRequest(config=v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(uid="u1"))),
                      v1.RunPodSandboxResponse(pod_sandbox_id=POD)),
    "CreateContainer": (v1.CreateContainerRequest(pod_sandbox_id=POD, config=v1.ContainerConfig()),
                        v1.CreateContainerResponse(container_id=CONTAINER)),
    "StartContainer": (v1.StartContainerRequest(container_id=CONTAINER), v1.StartContainerResponse()),
    "StopPodSandbox": (v1.StopPodSandboxRequest(pod_sandbox_id=POD), v1.StopPodSandboxResponse()),
    "RemoveContainer": (v1.RemoveContainerRequest(container_id=CONTAINER), v1.RemoveContainerResponse()),
}
START_POST = _server(IGNORE, HookType.POST_START_CONTAINER)
STOP_POD_POST = _server(IGNORE, HookType.POST_STOP_POD_SANDBOX)


@pytest.mark.parametrize(
    ("method", "servers", "pod", "container", "at_once"),
    [
        ("RunPodSandbox", (), False, False, True),  # its record is built from the request
        ("CreateContainer", (), True, False, True),  # built while the runtime works, from the stored pod
        ("CreateContainer", (), False, False, False),  # the pod would be read back from the runtime
        ("RemoveContainer", (), False, False, True),  # a record dropped
        ("StartContainer", (), False, False, True),  # nothing to record, no post hook
        ("StartContainer", (START_POST,), False, True, True),  # the post hook's request is stored
        ("StartContainer", (START_POST,), False, False, False),  # it would be read back first
        ("StopPodSandbox", (STOP_POD_POST,), True, False, True),
        ("StopPodSandbox", (STOP_POD_POST,), False, False, False),
    ],
)
async def test_the_answer_goes_at_once_only_when_nothing_after_it_reads_the_runtime(
    method: str, servers: tuple[Any, ...], pod: bool, container: bool, at_once: bool
) -> None:
    stage = _stage(*servers)
    _stored(stage, pod, container)
    reads: list[str] = []

    async def read_backend(method: str, request: bytes) -> bytes:
        reads.append(method)
        raise RuntimeError("no runtime here")

    stage.store.read_backend = read_backend
    request, response = REQUESTS[method]
    context = _Context(request_sent=True)

    async def send(data: bytes) -> bytes:
        context.events.append("at once" if context.at_once() else "held")
        return response.SerializeToString()

    stage_fn = stage.stage_for(method, "v1", "v1")
    assert stage_fn is not None
    await stage_fn(request.SerializeToString(), context, send)  # type: ignore[arg-type]
    assert context.events == (["at once"] if at_once else ["held"])
    if at_once:
        assert reads == []  # nothing after the answer read the runtime, as promised
    await stage.drain()  # post hooks started (and failing on no socket) end here


async def test_a_stop_whose_record_went_while_it_ran_keeps_its_answer_held() -> None:
    # Asked when the answer comes, not when the stop was sent: a stop takes
    # its grace period, and a removal of its pod drops the record meanwhile.
    stage = _stage(_server(IGNORE, HookType.POST_STOP_CONTAINER))
    _stored(stage, pod=True, container=True)
    context = _Context(request_sent=True)

    async def send(data: bytes) -> bytes:
        stage.store.drop_pod(POD)
        context.events.append("at once" if context.at_once() else "held")
        return b""

    stage_fn = stage.stage_for("StopContainer", "v1", "v1")
    assert stage_fn is not None
    await stage_fn(v1.StopContainerRequest(container_id=CONTAINER).SerializeToString(), context, send)  # type: ignore[arg-type]
    assert context.events == ["held"]
    await stage.drain()
