"""A hooked call is refused before its stages (hooks) run for as long as the
runtime cannot be reached, whatever state grpc's channel to it is in, and is
sent with its stages again as soon as the channel reaches the runtime
(cripath/unreachable.py). Run on both data paths: on frames, a connection
made while the runtime is away is answered by the proxy's own server.

Before: only TRANSIENT_FAILURE refused; a call made while the channel was
IDLE (its connection just dropped, or unused) or CONNECTING asked its hooks,
then failed at the runtime. Of these tests, the idle channel's refusal (both
paths) and the connecting channel's wait (grpc path) fail with that gate; the
others are guards: an outage end to end, and an idle channel to a live runtime
not refused."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.cripath.server import Proxy
from runtimeproxy.cripath.stage import StageProvider
from runtimeproxy.supervisor import TaskName

from ..fakes import FakeBackend

PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
S = grpc.ChannelConnectivity


class Asked(StageProvider):
    """A stage on ListPodSandbox that counts the calls it is asked about."""

    def __init__(self) -> None:
        self.asked = 0

    def stage_for(self, method, client_version, backend_version):  # type: ignore[no-untyped-def]
        if method != "ListPodSandbox":
            return None

        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            self.asked += 1
            return await send(request)

        return stage


async def outcome(sock_dir: Path, timeout: float = 5) -> str:
    """A ListPodSandbox on a connection of its own (kubelet's redial): OK, or its status."""
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
        try:
            await channel.unary_unary(PODS)(b"", timeout=timeout)
        except aio.AioRpcError as err:
            return f"{err.code().name}: {err.details()}"
    return "OK"


async def until_state(channel: aio.Channel, wanted: grpc.ChannelConnectivity) -> None:
    async with asyncio.timeout(10):
        while (state := channel.get_state()) is not wanted:
            await channel.wait_for_state_change(state)


async def asked_proxy(fake: FakeBackend, start_proxy) -> Proxy:  # type: ignore[no-untyped-def]
    """A proxy to ``fake`` whose ListPodSandbox stage counts its calls (``.asked``)."""
    stage = Asked()
    started: Proxy = await start_proxy(fake.socket, stages=(stage,))
    started.asked = stage  # type: ignore[attr-defined]
    return started


@pytest.fixture
async def proxy(fake: FakeBackend, start_proxy) -> Proxy:  # type: ignore[no-untyped-def]
    return await asked_proxy(fake, start_proxy)


async def test_no_stage_runs_across_an_outage_and_the_first_call_after_it_has_its_stage(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path
) -> None:
    """A regression guard: it passes with the TRANSIENT_FAILURE-only gate too,
    and fails with no gate at all."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    assert await outcome(sock_dir) == "OK" and stage.asked == 1
    await fake.stop()  # containerd killed: its socket gone
    loop = asyncio.get_running_loop()
    during: list[str] = []
    end = loop.time() + 1.5  # past several of the monitor's reconnect attempts (100 ms, doubling)
    while loop.time() < end:  # from the kill on, one call after another
        during.append(await outcome(sock_dir))
    assert stage.asked == 1, during
    assert during and all(o.startswith("UNAVAILABLE: ") for o in during), set(during)
    assert any("no hook server was asked" in o for o in during)
    await fake.start()
    after: list[str] = []
    async with asyncio.timeout(10):
        while not after or after[-1] != "OK":  # until the runtime is reached again
            after.append(await outcome(sock_dir))
    # Refused without its stage until then; the first call sent has its stage.
    assert all("no hook server was asked" in o for o in after[:-1]), after
    assert stage.asked == 2


async def test_a_call_on_an_idle_channel_whose_runtime_is_gone_is_refused_without_its_stage(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path
) -> None:
    """Nothing reconnects the channel here (the backend's monitor, which does, is
    stopped): it stays IDLE once the runtime left, as an unused one is."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    await proxy.tasks.stop([TaskName.MONITOR])
    await fake.stop()
    await until_state(proxy.backend.runtime_channel, S.IDLE)
    refused = await outcome(sock_dir)
    assert stage.asked == 0, refused
    assert refused.startswith("UNAVAILABLE: ") and "no hook server was asked" in refused, refused
    assert str(fake.socket) in refused


async def test_a_call_on_an_idle_channel_whose_runtime_is_up_is_sent_with_its_stage(
    proxy: Proxy, fake: FakeBackend, sock_dir: Path
) -> None:
    """IDLE is not down: the call waits for the connection the gate makes, and
    goes. (A guard for the gate's wait: the TRANSIENT_FAILURE-only gate let
    such a call through too.)"""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    await proxy.tasks.stop([TaskName.MONITOR])
    await fake.stop()
    await until_state(proxy.backend.runtime_channel, S.IDLE)
    await fake.start()
    assert await outcome(sock_dir) == "OK"
    assert stage.asked == 1


@pytest.fixture
async def silent(sock_dir: Path) -> AsyncIterator[Path]:
    """A socket that takes connections (the kernel's backlog) and never answers."""
    path = sock_dir / "silent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(64)
    yield path
    listener.close()


async def test_a_call_while_the_channel_is_still_connecting_waits_for_it_and_its_stage_is_not_asked(
    proxy: Proxy, fake: FakeBackend, silent: Path, sock_dir: Path
) -> None:
    """A runtime that takes connections but never speaks holds the channel in
    CONNECTING (grpc's connect timeout, 20 s): the call waits for it until its
    deadline, and ends DEADLINE_EXCEEDED without its stage, as it would have at
    the runtime. Only the grpc path's run covers the gate's wait: on the frames
    path the client's new connection is made to the silent runtime, and the
    client, never sent its SETTINGS, waits out its deadline without sending the
    call, so the proxy's gate is never reached (that run passes with the
    TRANSIENT_FAILURE-only gate too)."""
    stage: Asked = proxy.asked  # type: ignore[attr-defined]
    await proxy.tasks.stop([TaskName.MONITOR])
    await fake.stop()
    silent.rename(fake.socket)
    channel = proxy.backend.runtime_channel
    await until_state(channel, S.IDLE)
    channel.get_state(try_to_connect=True)
    await until_state(channel, S.CONNECTING)
    refused = await outcome(sock_dir, timeout=0.5)
    assert refused.startswith("DEADLINE_EXCEEDED"), refused
    assert stage.asked == 0
