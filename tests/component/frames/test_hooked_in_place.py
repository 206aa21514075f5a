"""Hooked calls on the frames data path run their stages in place (frames/hooked.py).

The request goes to the runtime on the client's own backend connection, not
through the grpc relay; the answer reaches the client only once the stages
are done with it; a stage that refuses or fails gets its status to the client
and leaves the connection (and its HPACK state) usable.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from runtimeproxy.cripath.stage import StageProvider
from runtimeproxy.frames import downstream

from ..fakes import FakeBackend

PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
VERSION = "/runtime.v1.RuntimeService/Version"


class Scripted(StageProvider):
    """A stage on ListPodSandbox whose behaviour a test sets."""

    def __init__(self) -> None:
        self.before = b""  # appended to the request
        self.refuse: tuple[grpc.StatusCode, str] | None = None
        self.fail_after_send = False
        self.replied = asyncio.Event()  # the runtime's answer reached the stage
        self.release: asyncio.Event | None = None  # the stage finishes once set
        self.seen: list[bytes] = []

    def stage_for(self, method, client_version, backend_version):  # type: ignore[no-untyped-def]
        if method != "ListPodSandbox":
            return None

        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            if self.refuse is not None:
                await context.abort(*self.refuse)
            reply = await send(request + self.before)
            self.seen.append(reply)
            self.replied.set()
            if self.release is not None:
                await self.release.wait()
            if self.fail_after_send:
                raise RuntimeError("a stage bug")
            return reply

        return stage


@pytest.fixture
def no_grpc_relay(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Any call the proxy re-issues through its grpc relay fails the test."""

    async def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a hooked call took the grpc relay")

    from runtimeproxy.cripath.forward import GrpcRelay

    monkeypatch.setattr(GrpcRelay, "unary", refuse)


async def test_a_hooked_call_runs_its_stage_on_the_clients_own_connection(
    fake: FakeBackend, start_proxy, client, no_grpc_relay
) -> None:
    fake.script(PODS, echo=True)
    stage = Scripted()
    stage.before = b"\x12\x00"  # what the stage adds reaches the runtime
    await start_proxy(fake.socket, stages=(stage,))
    reply = await client.unary_unary(PODS)(b"\x0a\x01x", timeout=10)
    assert reply == b"\x0a\x01x\x12\x00"
    assert fake.calls(PODS)[-1].requests == [b"\x0a\x01x\x12\x00"]
    assert stage.seen == [reply]


async def test_the_answer_waits_for_the_stage_to_finish(fake: FakeBackend, start_proxy, client, sock_dir) -> None:
    fake.script(PODS, echo=True)
    stage = Scripted()
    stage.release = asyncio.Event()
    await start_proxy(fake.socket, stages=(stage,))
    call = asyncio.ensure_future(client.unary_unary(PODS)(b"\x0a\x01y", timeout=10))
    await asyncio.wait_for(stage.replied.wait(), 10)
    # A whole round trip on another connection: had the answer been let go,
    # the client would have it by now.
    # (Its own subchannel: grpc would share the first one, whose answers wait
    # behind the held one, in HPACK order.)
    own = [("grpc.use_local_subchannel_pool", 1)]
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=own) as other:
        await other.unary_unary(VERSION)(b"", timeout=10)
    assert not call.done()
    stage.release.set()
    assert await asyncio.wait_for(call, 10) == b"\x0a\x01y"


async def test_a_stage_that_never_finishes_holds_the_answer_a_bounded_time(
    fake: FakeBackend, start_proxy, client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(downstream, "GATE_LIMIT_S", 0.2)
    fake.script(PODS, echo=True)
    stage = Scripted()
    stage.release = asyncio.Event()  # never set
    await start_proxy(fake.socket, stages=(stage,))
    assert await client.unary_unary(PODS)(b"\x0a\x01z", timeout=10) == b"\x0a\x01z"
    stage.release.set()


async def test_a_refusal_answers_the_client_and_the_connection_goes_on(
    fake: FakeBackend, start_proxy, client
) -> None:
    fake.script(PODS, echo=True)
    fake.script(VERSION, echo=True)
    stage = Scripted()
    stage.refuse = (grpc.StatusCode.FAILED_PRECONDITION, "a hook said no: überlastet 100%")
    await start_proxy(fake.socket, stages=(stage,))
    for _ in range(3):
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(PODS)(b"\x0a\x01r", timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details() == "a hook said no: überlastet 100%"
        # The runtime's HPACK state and the connection stay good for what follows.
        assert await client.unary_unary(VERSION)(b"\x0a\x01v", timeout=10) == b"\x0a\x01v"
    assert fake.calls(PODS) == []  # no request message ever reached the runtime


async def test_a_stage_failing_after_the_runtime_answered_is_internal_not_a_hang(
    fake: FakeBackend, start_proxy, client
) -> None:
    fake.script(PODS, echo=True)
    stage = Scripted()
    stage.fail_after_send = True
    await start_proxy(fake.socket, stages=(stage,))
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(PODS)(b"\x0a\x01f", timeout=10)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    fake.script(VERSION, echo=True)
    assert await client.unary_unary(VERSION)(b"\x0a\x01v", timeout=10) == b"\x0a\x01v"
