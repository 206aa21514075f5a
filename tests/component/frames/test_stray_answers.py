"""A v1alpha2-only runtime that answers the proxy's diverted v1 calls (their
header block, sent for HPACK's sake) at once, as grpc-go does: the client
gets the proxy's translated answers and keeps its connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc

from .gobackend import go_like_runtime


async def test_a_runtime_answering_diverted_calls_at_once_costs_the_client_nothing(start_proxy, sock_dir: Path) -> None:
    async with go_like_runtime(sock_dir / "runtime.sock") as runtime:
        await start_proxy(runtime.socket, serve_versions="v1")  # v1 for kubelet, translated for the runtime
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
            stub = v1_grpc.RuntimeServiceStub(channel)
            # The first call is alone on the connection (no stream closed yet); then many at once.
            first = await stub.Version(v1.VersionRequest(), timeout=10)
            answers = await asyncio.gather(*(stub.Version(v1.VersionRequest(), timeout=10) for _ in range(30)))
            status = await stub.Status(v1.StatusRequest(), timeout=10)
            assert channel.get_state() == grpc.ChannelConnectivity.READY  # never dropped
    assert {a.runtime_name for a in (first, *answers)} == {"go-like"}
    assert {a.runtime_api_version for a in (first, *answers)} == {"v1alpha2"}
    assert status == v1.StatusResponse()
    assert runtime.unknown_answered >= 32  # every diverted call's header block was answered at once
