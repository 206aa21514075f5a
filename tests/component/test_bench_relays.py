"""The benchmark's reference relays relay: the yardstick must measure a working relay."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from bench.relays import RELAYS

from .fakes import FakeBackend

RUN = "/runtime.v1.RuntimeService/RunPodSandbox"
STOP = "/runtime.v1.RuntimeService/StopPodSandbox"


@pytest.fixture(params=sorted(RELAYS))
async def relayed(request: pytest.FixtureRequest, fake: FakeBackend, sock_dir: Path,
                  capsys: pytest.CaptureFixture[str]) -> AsyncIterator[aio.Channel]:
    listen = sock_dir / "relay.sock"
    task = asyncio.create_task(RELAYS[request.param](str(listen), str(fake.socket)))
    async with aio.insecure_channel(f"unix://{listen}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        assert capsys.readouterr().out == "ready\n"
        yield channel
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_call_reaches_the_backend_and_its_answer_comes_back(relayed: aio.Channel, fake: FakeBackend) -> None:
    fake.script(RUN, echo=True)
    payload = bytes(range(256)) * 40  # larger than one read, any byte values
    assert await relayed.unary_unary(RUN)(payload, timeout=5) == payload
    assert fake.calls(RUN)[0].requests == [payload]


async def test_an_error_status_comes_back_unchanged(relayed: aio.Channel, fake: FakeBackend) -> None:
    fake.script(STOP, code=grpc.StatusCode.NOT_FOUND, details="no such sandbox")
    with pytest.raises(aio.AioRpcError) as err:
        await relayed.unary_unary(STOP)(b"", timeout=5)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such sandbox")
