"""A hook request the proxy cannot build (no record, and the runtime's status
unreadable): a Fail hook is not bypassed; an object the runtime says it does
not have is the runtime's to refuse."""

from __future__ import annotations

import json

import grpc
import pytest

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookclient.transport import CallFailed
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.stage import HookStage
from runtimeproxy.hookpath.store import StateStore

from .dispatchfakes import Chain, NoConnections

HOOK = HookType.PRE_UPDATE_CONTAINER_RESOURCES


class Down(NoConnections):
    """A hook server that is down."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        self.calls += 1
        raise CallFailed(grpc.StatusCode.UNAVAILABLE, "connection refused")


class Refused(Exception):
    pass


class Context:
    request_sent = False

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Refused(code, details)


class NotFound(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "not found")


def runtime(kind: str):  # type: ignore[no-untyped-def]
    async def read(method: str, request: bytes) -> bytes:
        if kind == "absent":
            raise NotFound()
        # A verbose status with no "config" (CRI-O's): no record can be made of it.
        info = {"sandboxID": "pod-1", "pid": 42, "runtimeSpec": {}}
        if method == "ContainerStatus":
            return v1.ContainerStatusResponse(info={"info": json.dumps(info)}).SerializeToString()
        return v1.PodSandboxStatusResponse(info={"info": json.dumps({})}).SerializeToString()

    return read


@pytest.mark.parametrize("kind", ["unreadable", "absent"])
@pytest.mark.parametrize("policy", [FailurePolicy.FAIL, FailurePolicy.IGNORE])
async def test_an_unbuilt_hook_request_refuses_only_under_fail(kind: str, policy: FailurePolicy) -> None:
    server = HookServerConfig("policy.json", "/run/policy.sock", policy, frozenset({HOOK}))
    transport = Down()
    stage = HookStage(Dispatcher(Chain(server), transport=transport), StateStore(read_backend=runtime(kind)))  # type: ignore[arg-type]
    sent: list[bytes] = []

    async def send(data: bytes) -> bytes:
        sent.append(data)
        return v1.UpdateContainerResourcesResponse().SerializeToString()

    request = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpu_quota=5000))
    run = stage.stage_for("UpdateContainerResources", "v1", "v1")
    assert run is not None
    if kind == "unreadable" and policy is FailurePolicy.FAIL:
        with pytest.raises(Refused) as refused:
            await run(request.SerializeToString(), Context(), send)  # type: ignore[arg-type]
        code, details = refused.value.args
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "policy.json" in details and "could not read" in details
        assert sent == []
    else:  # Ignore: skipped, as a failed hook is; absent: the runtime refuses it itself
        await run(request.SerializeToString(), Context(), send)  # type: ignore[arg-type]
        assert sent == [request.SerializeToString()]
    assert transport.calls == 0
    await stage.drain()
