"""A hooked call's answer goes in the read that completes it when its stages
say it may (``cripath.stage.answer_at_once``), while they finish their work
after it; otherwise it is held until they are done (frames/hooked.py)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack
import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from runtimeproxy.cripath.stage import answer_at_once
from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType
from runtimeproxy.hookpath.points import HookType

from ..hookpath.test_sends_unchanged import IGNORE, _server, _stage
from .test_as_read import _answer, _client_frames, _connection
from .test_connection import _data, _headers, _Routes, _turns
from .test_hooked_answer import _writes_on

MESSAGE = struct.pack(">BI", 0, 3) + b"abc"
ANSWER_FRAMES = [FrameType.HEADERS, FrameType.DATA, FrameType.HEADERS]


class _Recording(_Routes):
    """A stage that says its answer may go at once (before or after the
    runtime answered, ``early``), then records: it waits for ``recorded``
    after the answer, and fails there if ``fail``."""

    def __init__(self, early: bool = True, fail: bool = False) -> None:
        super().__init__()
        self.early = early
        self.fail = fail
        self.recorded = asyncio.Event()
        self.answered = asyncio.Event()
        self.done: list[str] = []

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            if self.early:
                answer_at_once(context, lambda: True)
            reply = await send(request)
            if not self.early:
                await self.answered.wait()  # the runtime's answer is in by now
                answer_at_once(context, lambda: True)
            await self.recorded.wait()
            if self.fail:
                raise RuntimeError("recording failed")
            self.done.append("recorded")
            return reply

        return (stage,)


async def _started(routes: _Recording) -> tuple[Any, Any]:
    """A connection whose one hooked call is complete and at the runtime: the connection and its client."""
    conn, client, _ = _connection(routes)
    conn.client_data(_headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True))
    await _turns()
    return conn, client


async def test_an_answer_the_stages_let_go_reaches_the_client_before_they_are_done() -> None:
    routes = _Recording()
    conn, client = await _started(routes)
    conn.backend_data(_answer(1))
    assert _writes_on(client, 1) == [ANSWER_FRAMES]  # whole, in this read's own write
    assert routes.done == []  # the stage records after it
    routes.recorded.set()
    await _turns()
    assert routes.done == ["recorded"]
    assert _writes_on(client, 1) == [ANSWER_FRAMES]  # nothing more on the stream
    assert conn.hooked == {} and conn.is_idle


async def test_an_answer_already_in_goes_when_the_stages_let_it() -> None:
    routes = _Recording(early=False)
    conn, client = await _started(routes)
    conn.backend_data(_answer(1))
    await _turns()
    assert _writes_on(client, 1) == []  # held: the stage has not said it may go
    routes.answered.set()
    await _turns()
    assert _writes_on(client, 1) == [ANSWER_FRAMES]
    assert routes.done == []
    routes.recorded.set()
    await _turns()
    assert routes.done == ["recorded"] and conn.hooked == {}


async def test_a_failed_answer_is_held_until_the_stages_are_done() -> None:
    routes = _Recording()
    conn, client = await _started(routes)
    block = hpack.Encoder().encode([(":status", "200"), ("grpc-status", "13")])
    conn.backend_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, block))
    assert _writes_on(client, 1) == []  # only a success goes at once: a failure is the stages' to see first
    await _turns()
    assert _writes_on(client, 1) == [[FrameType.HEADERS]]  # the runtime's status, verbatim
    assert routes.done == [] and conn.hooked == {}


async def test_a_stage_failing_after_its_answer_went_resets_nothing() -> None:
    routes = _Recording(fail=True)
    conn, client = await _started(routes)
    conn.backend_data(_answer(1))
    routes.recorded.set()
    await _turns()
    kinds = [f.type for f in _client_frames(client) if f.stream_id == 1]
    assert kinds == ANSWER_FRAMES  # the runtime's answer stands: no RST_STREAM after it
    assert conn.hooked == {} and conn.is_idle


def _call_headers(sid: int, method: str) -> bytes:
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", f"/runtime.v1.RuntimeService/{method}"),
                                    (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block)


@pytest.mark.parametrize(
    ("method", "hook", "message"),
    [
        ("StartContainer", HookType.POST_START_CONTAINER, v1.StartContainerRequest(container_id="c1")),
        # A stop's stage waits for its runtime call's own task: two loop turns after the answer.
        ("StopContainer", HookType.POST_STOP_CONTAINER, v1.StopContainerRequest(container_id="c1")),
        ("StopPodSandbox", HookType.POST_STOP_POD_SANDBOX, v1.StopPodSandboxRequest(pod_sandbox_id="p1")),
    ],
)
async def test_a_client_that_leaves_once_it_has_its_answer_still_gets_the_call_recorded(
    method: str, hook: HookType, message: Any
) -> None:
    stage = _stage(_server(IGNORE, hook))
    stage.store.put_pod("p1", hookapi.PodSandboxHookRequest())
    stage.store.put_container("c1", "p1", hookapi.ContainerResourceHookRequest())
    posts: list[HookType] = []

    async def run_post(hook: HookType, request: Any, fields: Any) -> None:
        posts.append(hook)

    stage.dispatcher.run_post = run_post  # type: ignore[method-assign]
    stage_fn = stage.stage_for(method, "v1", "v1")

    class _HookRoutes(_Routes):
        def hooked(self, path: str):  # type: ignore[no-untyped-def]
            return (stage_fn,)

    conn, client, _ = _connection(_HookRoutes())
    body = message.SerializeToString()
    conn.client_data(_call_headers(1, method) + _data(1, struct.pack(">BI", 0, len(body)) + body, end=True))
    await _turns()
    conn.backend_data(_answer(1))
    assert _writes_on(client, 1) == [ANSWER_FRAMES]  # in this read
    asyncio.get_running_loop().call_soon(conn.lost)  # the client's EOF, read at the next poll
    await _turns()
    await stage.drain()
    assert posts == [hook]  # the client has a success: the call's post hook is not lost
