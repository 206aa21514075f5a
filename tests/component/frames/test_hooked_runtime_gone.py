"""Hooked calls on the frames path (handled in place, frames/hooked.py) when
the runtime goes away: none runs its stages for a call the runtime can no
longer get, and no connection is left wedged.

- a call on a client connection relayed before the runtime left: the proxy
  closed that connection as the runtime's closed (runtimegone.py), so the
  client's call comes on a new one, which the proxy's own server answers
  (listener.py): refused before its stages (cripath/unreachable.py);
- a call whose stages run when the runtime leaves (resets its stream, or
  closes its connection): they are stopped before they send it, and the
  client has the runtime's end, or UNAVAILABLE;
- a call the runtime answers before its request was sent (a refusal at its
  headers, its deadline): its stages are stopped, and the client has the
  runtime's answer at once;
- either way the client's next call, once the runtime is back, is sent with
  its stages."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.cripath.stage import StageProvider
from runtimeproxy.frames import downstream

from ..fakes import FakeBackend

PODS = "/runtime.v1.RuntimeService/ListPodSandbox"


class Held(StageProvider):
    """A stage on ListPodSandbox: counts the calls it is asked about and those
    it sends, and, while ``hold`` is set, waits for it before sending."""

    def __init__(self) -> None:
        self.asked = 0
        self.sent = 0
        self.cancelled = 0
        self.stopped = asyncio.Event()  # set once it was cancelled
        self.hold: asyncio.Event | None = None
        self.holding = asyncio.Event()

    def stage_for(self, method, client_version, backend_version):  # type: ignore[no-untyped-def]
        if method != "ListPodSandbox":
            return None

        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            self.asked += 1
            if self.hold is not None:
                self.holding.set()
                try:
                    await self.hold.wait()
                except asyncio.CancelledError:
                    self.cancelled += 1
                    self.stopped.set()
                    raise
            self.sent += 1
            return await send(request)

        return stage


async def outcome(channel: aio.Channel) -> str:
    try:
        await channel.unary_unary(PODS)(b"", timeout=5)
    except aio.AioRpcError as err:
        return f"{err.code().name}: {err.details()}"
    return "OK"


async def until_ok(channel: aio.Channel) -> list[str]:
    """The client's calls until one is answered OK (the proxy's channel reconnects meanwhile)."""
    seen: list[str] = []
    async with asyncio.timeout(10):
        while not seen or seen[-1] != "OK":
            seen.append(await outcome(channel))
    return seen


async def test_a_hooked_call_after_the_runtime_left_is_refused_before_its_stages(
    fake: FakeBackend, start_proxy, client: aio.Channel
) -> None:
    stage = Held()
    await start_proxy(fake.socket, stages=(stage,))
    assert await outcome(client) == "OK" and stage.asked == 1  # the client's connection, relayed
    await fake.stop()
    refused = [await outcome(client) for _ in range(3)]
    assert stage.asked == 1, refused
    # A call racing the close of the client's relayed connection may fail in the
    # client's own transport ("Stream removed"); once on its next connection, refused.
    assert all(o.startswith("UNAVAILABLE: ") for o in refused), refused
    assert "no hook server was asked" in refused[-1], refused
    await fake.start()
    after = await until_ok(client)
    assert all(o.startswith("UNAVAILABLE: ") for o in after[:-1]), after
    assert stage.asked == 2 and stage.sent == 2


async def test_a_hooked_call_whose_stages_run_as_the_runtime_leaves_is_not_sent_and_ends_unavailable(
    fake: FakeBackend, start_proxy, client: aio.Channel
) -> None:
    stage = Held()
    await start_proxy(fake.socket, stages=(stage,))
    assert await outcome(client) == "OK"
    stage.hold = asyncio.Event()
    call = asyncio.ensure_future(outcome(client))
    await asyncio.wait_for(stage.holding.wait(), 5)
    await fake.stop()  # it resets the calls it has, then closes its connections
    ended = await asyncio.wait_for(call, 5)  # before its stages are let go
    assert ended.split(":")[0] in ("UNAVAILABLE", "CANCELLED"), ended
    await asyncio.wait_for(stage.stopped.wait(), 5)
    assert stage.cancelled == 1
    stage.hold.set()
    stage.hold = None
    await fake.start()
    await until_ok(client)  # the same client: nothing of the connection is left waiting
    assert stage.sent == 2  # the first call's, and the last one's
    assert [c.path for c in fake.calls(PODS)] == [PODS, PODS]


async def test_with_a_call_of_the_proxys_own_open_a_hooked_call_as_the_runtime_leaves_ends_and_the_client_moves_on(
    fake: FakeBackend, start_proxy, client: aio.Channel
) -> None:
    """The client's connection stays for the proxy's own answers (a health
    Watch) once the runtime left; a hooked call it had in its stages ends, its
    stages stopped, and the client's next calls go to a new connection."""
    stage = Held()
    await start_proxy(fake.socket, stages=(stage,))
    watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(service=""))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    stage.hold = asyncio.Event()
    call = asyncio.ensure_future(outcome(client))
    await asyncio.wait_for(stage.holding.wait(), 5)
    await fake.stop()
    ended = await asyncio.wait_for(call, 5)
    assert ended.split(":")[0] in ("UNAVAILABLE", "CANCELLED"), ended
    await asyncio.wait_for(stage.stopped.wait(), 5)
    assert stage.cancelled == 1
    stage.hold = None
    refused = await outcome(client)
    assert "no hook server was asked" in refused and stage.asked == 1, refused
    await fake.start()
    await until_ok(client)
    assert stage.sent == 1
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
        await watch.read()


async def test_a_hooked_call_the_runtime_ends_before_its_request_stops_its_stages(
    fake: FakeBackend, start_proxy, client: aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime answers the call at its headers, before the stages sent its
    request (here: a refusal; else its deadline, or its stream reset): the
    stages still asking hooks are stopped, as when the client leaves, and the
    client has the runtime's answer at once, not after them."""
    # The answer's hold for its stages, far longer than the wait below: the
    # answer must come as the stages stop, not as the hold ends.
    monkeypatch.setattr(downstream, "GATE_LIMIT_S", 30.0)
    stage = Held()
    await start_proxy(fake.socket, stages=(stage,))
    stage.hold = asyncio.Event()
    fake.script(PODS, unread=True, code=grpc.StatusCode.UNAVAILABLE, details="not now")
    call = asyncio.ensure_future(outcome(client))
    await asyncio.wait_for(stage.holding.wait(), 5)
    assert await asyncio.wait_for(call, 10) == "UNAVAILABLE: not now"  # before its answer's hold (GATE_LIMIT_S)
    await asyncio.wait_for(stage.stopped.wait(), 5)
    stage.hold.set()
    stage.hold = None
    fake.script(PODS)
    assert await outcome(client) == "OK"  # the connection goes on
    assert stage.asked == 2 and stage.sent == 1
