"""The frames data path counts its client connections by path, relayed or
spliced (answered by the proxy's own server while the runtime cannot be
dialled), made so far and open now: which path serves kubelet shows in the
metrics. Before: nothing told them apart (a spliced connection costs several
times a relayed call's CPU)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from grpc import aio
from prometheus_client import CollectorRegistry

from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy
from runtimeproxy.frames import listener
from runtimeproxy.metrics import CriCallMetrics

from ..fakes import FakeBackend
from .test_spliced_goaway import LIST, socket_away

TOTAL = "runtime_proxy_frames_connections_total"
OPEN = "runtime_proxy_frames_connections_open"


def own_channel(sock_dir: Path) -> aio.Channel:
    """A connection of its own (grpc would share one subchannel between channels)."""
    return aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=[("grpc.use_local_subchannel_pool", 1)])


async def until(what: str, check: Callable[[], bool]) -> None:
    """The listener learns of a closed connection from its socket, after the client's close returns."""
    try:
        async with asyncio.timeout(10):
            while not check():  # noqa: ASYNC110 - no event for the listener's count; bounded
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"{what}: not within 10 s") from None


async def test_connections_are_counted_by_path_made_and_open(
    fake: FakeBackend, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener, "REDIAL_FIRST_S", 3600.0)  # the spliced one stays spliced
    registry = CollectorRegistry()
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames"),
                  calls=CriCallMetrics(registry))

    def value(name: str, path: str) -> float | None:
        return registry.get_sample_value(name, {"path": path})

    await proxy.start()
    try:
        await proxy.wait_ready(10)
        async with own_channel(sock_dir) as relayed:
            await relayed.unary_unary(LIST)(b"", timeout=5)
            assert (value(TOTAL, "relayed"), value(OPEN, "relayed")) == (1, 1)
            assert value(TOTAL, "spliced") is None
            with socket_away(fake.socket):
                async with own_channel(sock_dir) as spliced:
                    await spliced.unary_unary(LIST)(b"", timeout=5)  # the proxy's own server answers it
                    assert (value(TOTAL, "spliced"), value(OPEN, "spliced")) == (1, 1)
                await until("the spliced connection closed", lambda: value(OPEN, "spliced") == 0)
            assert value(OPEN, "relayed") == 1
        await until("the relayed connection closed", lambda: value(OPEN, "relayed") == 0)
        assert (value(TOTAL, "relayed"), value(TOTAL, "spliced")) == (1, 1)
    finally:
        await proxy.stop(0)
