"""A client connection made while the runtime could not be dialled (containerd
restarting) is answered by the proxy's own grpc.aio server; once the runtime
is back, the client is told to reconnect (GOAWAY), and its calls are relayed
again, not re-issued through grpc.aio for the connection's life.

Before: kubelet's connection, redialled during a containerd restart, stayed on
the proxy's own server until the proxy or kubelet restarted, at several times
a relayed call's CPU, and nothing said so."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc import aio

from ..fakes import FakeBackend

LIST = "/runtime.v1.RuntimeService/ListContainers"
AGENT = "kubelet-under-test/1.0"


def relayed(fake: FakeBackend) -> list[bool]:
    """For each ListContainers the runtime got: whether it came as the client sent it (its user agent kept)."""
    return [AGENT in str(r.metadata.get("user-agent", "")) for r in fake.calls(LIST)]


async def test_a_connection_made_while_the_runtime_was_away_is_relayed_once_it_is_back(
    sock_dir: Path, start_proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.frames.listener")
    socket = sock_dir / "b.sock"
    lost, probed = asyncio.Event(), asyncio.Event()
    async with FakeBackend(socket):
        proxy = await start_proxy(socket, data_path="frames")
        proxy.backend.on_lost(lost.set)
    await asyncio.wait_for(lost.wait(), 10)
    options = [("grpc.primary_user_agent", AGENT)]
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=options) as channel:
        with pytest.raises(aio.AioRpcError) as away:  # a connection made now: nothing to dial
            await channel.unary_unary(LIST)(b"", timeout=5)
        assert away.value.code() == grpc.StatusCode.UNAVAILABLE
        proxy.backend.on_change(lambda info: probed.set())
        async with FakeBackend(socket) as fake:
            await asyncio.wait_for(probed.wait(), 10)
            # Calls sent before the client read the GOAWAY still go on the old connection.
            for _ in range(50):
                await channel.unary_unary(LIST)(b"", timeout=5)
                if relayed(fake)[-1]:
                    break
            assert relayed(fake)[-1], relayed(fake)
            await channel.unary_unary(LIST)(b"", timeout=5)
            assert relayed(fake)[-1]
    told = [r for r in caplog.records if r.getMessage().startswith("connections made while the runtime")]
    assert [r.connections for r in told] == [1]  # type: ignore[attr-defined]
