"""While the runtime's connection has failed (containerd killed, not back
yet), a hooked call is refused UNAVAILABLE before its hooks are asked, and
failed calls are no warning each: the outage has its own lines.

Before: every RunPodSandbox kubelet retried during a 24 s containerd restart
asked each PreRunPodSandbox hook server (325 calls for pods never made), then
failed at the runtime; and each failed call logged the warning `call failed`
(230 lines in 10 s of the trial)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import RunningProxy

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend
from ..hookpath.crirequests import RUN_POD, sandbox_config

LIST = "/runtime.v1.RuntimeService/ListContainers"


async def connection_failed(channel: aio.Channel) -> None:
    """Until the proxy's runtime channel is in TRANSIENT_FAILURE (its state changes awaited)."""
    async with asyncio.timeout(10):
        while (state := channel.get_state(try_to_connect=True)) is not grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            await channel.wait_for_state_change(state)


async def test_a_hooked_call_is_refused_without_its_hooks_while_the_runtime_is_unreachable(
    running: RunningProxy, fake: FakeBackend, sock_dir: Path, hook_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.cripath.forward")
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.cripath.unreachable")
    async with hook_server(sock_dir, "rec", {}) as hook:
        hook.register(hook_dir, ["PreRunPodSandbox"], "Fail", timeout="5s")
        await registered(running, 1)
        lost = asyncio.Event()
        running.proxy.backend.on_lost(lost.set)
        await fake.stop()  # as containerd killed: its socket gone
        await asyncio.wait_for(lost.wait(), 10)
        await connection_failed(running.proxy.backend.runtime_channel)
        request = v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString()
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:  # kubelet's redial
            with pytest.raises(aio.AioRpcError) as refused:
                await channel.unary_unary(RUN_POD)(request, timeout=10)
            with pytest.raises(aio.AioRpcError) as failed:
                await channel.unary_unary(LIST)(b"", timeout=10)
        assert hook.requests("PreRunPodSandbox") == []
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not reachable" in refused.value.details() and "no hook server was asked" in refused.value.details()
    assert str(fake.socket) in refused.value.details()
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    calls_failed = [r for r in caplog.records if r.getMessage() == "call failed"]
    assert calls_failed and all(r.levelno == logging.DEBUG for r in calls_failed), [
        (r.levelname, r.__dict__.get("method")) for r in calls_failed]
    # The refusal too, naming the call and the runtime's socket.
    assert [r.__dict__.get("backend") for r in calls_failed if r.__dict__.get("method") == RUN_POD] == [
        str(fake.socket)]
