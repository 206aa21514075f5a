"""When the hook stage lets a call go to the runtime as it was read
(``HookStage.sends_unchanged``), and what it does with such a call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath import containerexecutors, podexecutors
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.stage import HookStage
from runtimeproxy.hookpath.store import StateStore, pod_record

from .dispatchfakes import Chain


def _server(policy: FailurePolicy, *hooks: HookType) -> HookServerConfig:
    return HookServerConfig("h.json", "/run/h.sock", policy, frozenset(hooks), timeout=1.0)


def _stage(*servers: HookServerConfig) -> HookStage:
    return HookStage(Dispatcher(Chain(*servers)), StateStore())  # type: ignore[arg-type]


IGNORE, FAIL = FailurePolicy.IGNORE, FailurePolicy.FAIL


@pytest.mark.parametrize(
    ("servers", "method", "unchanged"),
    [
        ((), "RunPodSandbox", True),
        ((), "RemoveContainer", True),
        ((_server(IGNORE, HookType.PRE_RUN_POD_SANDBOX),), "RunPodSandbox", False),  # a pre hook may change it
        ((_server(IGNORE, HookType.PRE_RUN_POD_SANDBOX),), "StartContainer", True),  # not this method's
        # its pod's cgroup parent, if a PreRunPodSandbox hook moved it (even a
        # server since removed), is carried into the call while any server is registered
        ((_server(IGNORE, HookType.PRE_RUN_POD_SANDBOX),), "CreateContainer", False),
        ((_server(IGNORE, HookType.POST_START_CONTAINER),), "CreateContainer", False),
        ((), "CreateContainer", True),
        ((_server(IGNORE, HookType.POST_STOP_CONTAINER),), "StopContainer", True),  # post hooks come after
        ((_server(FAIL, HookType.POST_STOP_CONTAINER),), "StopContainer", False),  # must see it decoded first
        ((_server(IGNORE, HookType.PRE_START_CONTAINER, HookType.POST_START_CONTAINER),), "StartContainer", False),
        ((), "Version", False),  # not the hook stage's
    ],
)
def test_a_call_goes_as_read_only_when_no_hook_must_come_first(
    servers: tuple[HookServerConfig, ...], method: str, unchanged: bool
) -> None:
    assert _stage(*servers).sends_unchanged(method) is unchanged


async def test_a_call_waiting_behind_a_lock_keeps_its_place() -> None:
    stage = _stage()
    release = await stage.locks.acquire("pod-1")  # a call on some object is under way
    assert not stage.sends_unchanged("RemovePodSandbox")  # it may be on that object: not passed
    release()
    assert stage.sends_unchanged("RemovePodSandbox")


class _Context:
    def __init__(self, request_sent: bool) -> None:
        self.request_sent = request_sent

    async def abort(self, code: Any, details: str = "") -> None:
        raise AssertionError(f"aborted: {code} {details}")


async def test_a_call_the_runtime_has_is_recorded_from_what_was_built_while_it_worked(monkeypatch) -> None:
    stage = _stage()
    config = v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="p", uid="u1", namespace="ns"), labels={"a": "b"})
    request = v1.RunPodSandboxRequest(config=config).SerializeToString()
    events: list[str] = []
    built: list[Any] = []
    build = podexecutors.RunPodSandbox.early_seen

    def early_seen(self, req, store):  # type: ignore[no-untyped-def]
        events.append("built")
        built.append(build(self, req, store))
        return built[-1]

    monkeypatch.setattr(podexecutors.RunPodSandbox, "early_seen", early_seen)

    async def send(data: bytes) -> bytes:
        assert data == request  # sent as it came
        events.append("answered")
        return v1.RunPodSandboxResponse(pod_sandbox_id="pod-1").SerializeToString()

    stage_fn = stage.stage_for("RunPodSandbox", "v1", "v1")
    assert stage_fn is not None
    await stage_fn(request, _Context(request_sent=True), send)  # type: ignore[arg-type]
    assert events == ["built", "answered"]
    record = stage.store.pods["pod-1"]
    assert record is built[0]  # not built again once the runtime answered
    assert (record.pod_meta.uid, dict(record.labels)) == ("u1", {"a": "b"})


async def test_a_call_the_runtime_has_is_rechecked_when_its_stage_fails_before_the_answer(monkeypatch) -> None:
    rechecked: list[str] = []

    async def unsure(self, req, store):  # type: ignore[no-untyped-def]
        rechecked.append(req.container_id)

    async def failing_skip(self, req, store):  # type: ignore[no-untyped-def]
        raise asyncio.CancelledError  # its client left while the pod was read back, say

    monkeypatch.setattr(containerexecutors.StopContainer, "unsure", unsure)
    monkeypatch.setattr(containerexecutors.StopContainer, "read_skips", failing_skip)
    stage = _stage(_server(IGNORE, HookType.POST_STOP_CONTAINER))  # a post hook, so the opt-out is read

    async def send(data: bytes) -> bytes:
        raise AssertionError("not reached")

    stage_fn = stage.stage_for("StopContainer", "v1", "v1")
    assert stage_fn is not None
    request = v1.StopContainerRequest(container_id="ctr-2").SerializeToString()
    with pytest.raises(asyncio.CancelledError):
        await stage_fn(request, _Context(request_sent=True), send)  # type: ignore[arg-type]
    await stage.rechecked()
    assert rechecked == ["ctr-2"]


async def test_pre_hooks_are_not_asked_about_a_call_the_runtime_has() -> None:
    """A server registered after the call was sent as read sees the next call, not this one."""
    stage = _stage(_server(FAIL, HookType.PRE_RUN_POD_SANDBOX))  # unreachable: asking it would refuse the call
    config = v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="p", uid="u2", namespace="ns"))
    request = v1.RunPodSandboxRequest(config=config).SerializeToString()

    async def send(data: bytes) -> bytes:
        return v1.RunPodSandboxResponse(pod_sandbox_id="pod-2").SerializeToString()

    stage_fn = stage.stage_for("RunPodSandbox", "v1", "v1")
    assert stage_fn is not None
    await stage_fn(request, _Context(request_sent=True), send)  # type: ignore[arg-type]
    assert stage.store.pods["pod-2"].pod_meta.uid == "u2"
    with pytest.raises(AssertionError, match="aborted"):  # told nothing, the same call asks it (and fails)
        await stage_fn(request, _Context(request_sent=False), send)  # type: ignore[arg-type]
    await stage.dispatcher.close()


async def test_shutdown_settles_a_call_the_runtime_has_before_it_stops_what_reads_the_backend(monkeypatch) -> None:
    """Its stage may still read the runtime (an opt-out read back) or re-check it: settle waits for it."""
    opened = asyncio.Event()

    async def slow_skip(self, req, store):  # type: ignore[no-untyped-def]
        await opened.wait()
        return False

    monkeypatch.setattr(containerexecutors.StopContainer, "read_skips", slow_skip)
    stage = _stage(_server(IGNORE, HookType.POST_STOP_CONTAINER))

    async def send(data: bytes) -> bytes:
        return v1.StopContainerResponse().SerializeToString()

    stage_fn = stage.stage_for("StopContainer", "v1", "v1")
    assert stage_fn is not None
    request = v1.StopContainerRequest(container_id="ctr-3").SerializeToString()
    call = asyncio.ensure_future(stage_fn(request, _Context(request_sent=True), send))  # type: ignore[arg-type]
    for _ in range(5):
        await asyncio.sleep(0)
    settling = asyncio.ensure_future(stage.settle())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not settling.done()
    opened.set()
    await asyncio.wait_for(asyncio.gather(call, settling), 5)
    await stage.dispatcher.close()


@pytest.mark.parametrize(("carries", "parent"), [(True, "/moved"), (False, "/kubelets")])
async def test_a_creation_carries_its_moved_pod_unless_the_stage_must_not(carries: bool, parent: str) -> None:
    # NRI builds its stage with carries=False: it never applies a
    # PreRunPodSandbox answer, so a record saying otherwise must move nothing.
    stage = HookStage(
        Dispatcher(Chain(_server(IGNORE, HookType.PRE_RUN_POD_SANDBOX))), StateStore(), carries=carries  # type: ignore[arg-type]
    )
    stage.store.put_pod("pod-1", pod_record(v1.PodSandboxConfig(linux=v1.LinuxPodSandboxConfig(cgroup_parent="/moved"))))
    assert stage.sends_unchanged("CreateContainer") is not carries
    request = v1.CreateContainerRequest(
        pod_sandbox_id="pod-1", sandbox_config=v1.PodSandboxConfig(linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubelets"))
    )
    sent: list[bytes] = []

    async def send(data: bytes) -> bytes:
        sent.append(data)
        return v1.CreateContainerResponse(container_id="c1").SerializeToString()

    stage_fn = stage.stage_for("CreateContainer", "v1", "v1")
    assert stage_fn is not None
    await stage_fn(request.SerializeToString(), _Context(request_sent=False), send)  # type: ignore[arg-type]
    assert v1.CreateContainerRequest.FromString(sent[0]).sandbox_config.linux.cgroup_parent == parent
