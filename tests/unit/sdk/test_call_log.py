"""The SDK's line per served hook call, at debug (hooks/calllog.py).

Before: a served call logged nothing unless its handler failed, so a hook
author could not see whether the proxy called the hook at all.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2, api_pb2_grpc
from hooks.routes import answer
from hooks.sdk import HookAbort, HookServer
from runtimeproxy.hookpath.points import HookType
from tests.hookrequests import container_request, pod_request


class Mixed(HookServer):
    """One handler per outcome."""

    async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
        return api_pb2.ContainerResourceHookResponse(container_envs={"A": "1"})

    async def pre_run_pod_sandbox(self, request):  # type: ignore[no-untyped-def]
        raise HookAbort(grpc.StatusCode.PERMISSION_DENIED, "not this pod")

    async def pre_update_container_resources(self, request):  # type: ignore[no-untyped-def]
        raise RuntimeError("database on fire")

    async def pre_start_container(self, request):  # type: ignore[no-untyped-def]
        return api_pb2.PodSandboxHookResponse()  # the wrong type


def _calls(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if " hook call " in r.getMessage()]


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_each_call_is_logged_at_debug_with_its_pod_container_and_outcome(
    sock_dir: Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "hooks.sdk")  # what logging.basicConfig(level=logging.DEBUG) enables
    async with Mixed(sock_dir / "m.sock", transport=transport) as server, \
            grpc.aio.insecure_channel(server.target) as channel:
        stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
        await stub.PreCreateContainerHook(container_request(), timeout=5)
        await stub.PostStopContainerHook(container_request(), timeout=5)  # no handler: answered all the same
        for call, request in ((stub.PreRunPodSandboxHook, pod_request()),
                              (stub.PreUpdateContainerResourcesHook, container_request()),
                              (stub.PreStartContainerHook, container_request())):
            with pytest.raises(grpc.aio.AioRpcError):
                await call(request, timeout=5)
    calls = _calls(caplog)
    assert [(r.levelno, r.hook, r.outcome, getattr(r, "grpc_code", None)) for r in calls] == [
        (logging.DEBUG, "PreCreateContainer", "answered", None),
        (logging.DEBUG, "PostStopContainer", "answered", None),
        (logging.DEBUG, "PreRunPodSandbox", "error", "PERMISSION_DENIED"),
        (logging.DEBUG, "PreUpdateContainerResources", "error", "INTERNAL"),
        (logging.DEBUG, "PreStartContainer", "error", "INTERNAL"),
    ]
    first, _, pod = calls[0], calls[1], calls[2]
    assert (first.pod, first.pod_uid, first.container, first.container_id) == ("default/nginx", "uid-1", "web", "cid-1")
    assert first.duration_s >= 0
    assert first.getMessage().startswith("PreCreateContainer hook call answered in ")
    assert (pod.pod, pod.pod_uid) == ("default/nginx", "uid-1") and not hasattr(pod, "container")
    assert pod.getMessage().endswith("(PERMISSION_DENIED)")
    # A handler's failure keeps its own line at its own level.
    levels = {r.getMessage().split(" ")[0]: r.levelno for r in caplog.records if " hook call " not in r.getMessage()
              and r.name == "hooks.sdk" and "listening" not in r.getMessage()}
    assert levels == {"PreUpdateContainerResources": logging.ERROR, "PreStartContainer": logging.ERROR}


@pytest.mark.parametrize("deadline", [True, False])
async def test_a_cancelled_call_is_logged_as_deadline_exceeded_or_cancelled(
    deadline: bool, caplog: pytest.LogCaptureFixture
) -> None:
    started = asyncio.Event()

    class Slow(HookServer):
        async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
            started.set()
            await asyncio.Event().wait()

    caplog.set_level(logging.DEBUG, "hooks.sdk")
    server = Slow("/tmp/never-started.sock")
    task = asyncio.ensure_future(answer(server, HookType.PRE_CREATE_CONTAINER, container_request(), lambda: deadline))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (call,) = _calls(caplog)
    assert call.outcome == ("deadline_exceeded" if deadline else "cancelled") and call.container == "web"
    (cancelled,) = [r for r in caplog.records if "handler cancelled" in r.getMessage()]
    assert cancelled.levelno == (logging.WARNING if deadline else logging.INFO)  # its own line, its level kept


async def test_nothing_is_logged_per_call_above_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "hooks.sdk")
    server = Mixed("/tmp/never-started.sock")
    await answer(server, HookType.PRE_CREATE_CONTAINER, container_request())
    with pytest.raises(HookAbort):
        await answer(server, HookType.PRE_RUN_POD_SANDBOX, pod_request())
    assert caplog.records == []


DOCUMENTED = {"hook", "outcome", "duration_s", "grpc_code", "pod", "pod_uid", "container", "container_id"}
STANDARD = set(vars(logging.LogRecord("x", logging.DEBUG, "x", 0, "x", None, None))) | {"message", "asctime"}


async def test_a_calls_line_carries_no_request_data_beyond_its_documented_fields(
    caplog: pytest.LogCaptureFixture
) -> None:
    """Env values and annotations are a pod's secrets as often as not: a log
    shipped off the node must not get them from a debug line."""
    caplog.set_level(logging.DEBUG, "hooks.sdk")
    secret = "s3cr3t-" + "x" * 8
    request = container_request(pod_annotations={"vault-token": f"{secret}-pod"})
    request.container_envs["DB_PASSWORD"] = f"{secret}-env"
    request.container_annotations["api-key"] = f"{secret}-annotation"
    server = Mixed("/tmp/never-started.sock")
    await answer(server, HookType.PRE_CREATE_CONTAINER, request)
    with pytest.raises(HookAbort):
        await answer(server, HookType.PRE_UPDATE_CONTAINER_RESOURCES, request)
    calls = _calls(caplog)
    assert [r.outcome for r in calls] == ["answered", "error"]
    for record in calls:
        assert set(vars(record)) - STANDARD <= DOCUMENTED
        carried = [record.getMessage(), *(repr(value) for value in vars(record).values())]
        assert not [text for text in carried if secret in text or "DB_PASSWORD" in text or "api-key" in text]


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_request_that_cannot_be_decoded_gets_its_line_with_method_and_size(
    sock_dir: Path, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No handler is called for it, so it had no line: a caller whose calls all
    failed (INTERNAL, or grpc.aio's UNKNOWN) looked as if it never called.
    The line carries no request byte, only the size."""
    caplog.set_level(logging.DEBUG, "hooks.sdk")
    method = "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook"
    async with Mixed(sock_dir / "m.sock", transport=transport) as server, \
            grpc.aio.insecure_channel(server.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await channel.unary_unary(method)(b"\xff\xff\xff", timeout=5)
    (line,) = _calls(caplog)
    assert (line.levelno, line.hook, line.method, line.outcome, line.request_bytes) == (
        logging.DEBUG, "PreCreateContainer", method, "undecodable", 3)
    assert line.getMessage().startswith("PreCreateContainer hook call could not be decoded: 3 bytes, ")
    assert line.error and set(vars(line)) - STANDARD <= DOCUMENTED | {"method", "request_bytes", "error"}
