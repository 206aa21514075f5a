"""A runtime lost while a hooked call's pre hooks run stops the chain: the
later hook servers are not asked, the call is not sent, and the client gets
UNAVAILABLE. On the grpc path the outage gate is asked again before each pre
hook (cripath/unreachable.py, ``runtime_gate``); on the frames path the
runtime connection's close cancels the call's stages (frames/runtimegone.py).

Before (grpc path): the gate was asked once, before the first pre hook: the
second hook server was asked about a call whose runtime was gone."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1

from ...hookprocs import hook_server, registered
from .crirequests import RUN_POD, sandbox_config

PRE = "PreRunPodSandbox"


async def test_a_runtime_lost_while_a_pre_hook_runs_stops_the_chain(running, fake, client, sock_dir, hook_dir) -> None:
    # "a" is asked first (same priority: by file name); it answers after its delay.
    async with hook_server(sock_dir, "a", {PRE: {"delay": 1.5}}) as first, hook_server(sock_dir, "b", {PRE: {}}) as second:
        first.register(hook_dir, [PRE], timeout="10s")
        second.register(hook_dir, [PRE], timeout="10s")
        await registered(running, 2)
        request = v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString()
        call = asyncio.ensure_future(client.unary_unary(RUN_POD)(request, timeout=20))
        await first.received(PRE)
        await fake.stop()  # containerd killed while the first pre hook works
        with pytest.raises(aio.AioRpcError) as failed:
            await call
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
        assert second.records() == [], failed.value.details()
        assert not fake.calls(RUN_POD)
        details = failed.value.details() or ""
        if running.proxy._data_path == "grpc":  # noqa: SLF001 - which path serves
            assert "no later hook server of its chain was asked" in details, details
        else:  # the runtime's own end of the stream, relayed (a killed containerd: its connection's close)
            assert details in ("Cancelling all calls", "runtime-proxy: the runtime closed the connection"), details
