"""The interface between the CRI path and what features add to a call.

A stage sees the request bytes (always in a form the v1 classes read) and
calls ``send`` to go on; it may change the request, look at the response, or
refuse by aborting the context. The router composes a method's stages once,
when its table is built. The frames path also asks per call whether they
have work (``StageProvider.needed``), and relays the call verbatim if not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from grpc import aio

Send = Callable[[bytes], Awaitable[bytes]]
# A coroutine, not any awaitable: the NRI adapter runs it as a task.
Stage = Callable[[bytes, aio.ServicerContext, Send], Coroutine[Any, Any, bytes]]
Unary = Callable[[bytes, aio.ServicerContext], Awaitable[bytes]]


def request_sent(context: aio.ServicerContext) -> bool:
    """Whether the call's request already went to the runtime as the client
    sent it (``StageProvider.sends_unchanged``); never so on the grpc path."""
    return getattr(context, "request_sent", False)


def answer_at_once(context: aio.ServicerContext, ready: Callable[[], bool]) -> None:
    """Tell the data path that the runtime's successful answer may go to the
    client as it arrives if ``ready()`` says so then: what the stage does
    after it (recording, starting post hooks) then neither changes the answer
    nor waits on the runtime, and is not cancelled when the client leaves.
    Stages never change a successful answer, so one stage may say this for
    the chain. The frames path holds a hooked call's answer until its stages
    are done otherwise; the grpc path always does."""
    release = getattr(context, "answer_at_once", None)
    if release is not None:
        release(ready)


def compose(stages: Sequence[Stage], last: Unary) -> Unary:
    """``stages`` in order, each sending on to the next, the last to ``last``
    (the backend call of whichever data path carries the call)."""
    if len(stages) == 1:  # (nearly every method: the hook stage alone) one coroutine less per call
        only = stages[0]

        async def handle_one(request: bytes, context: aio.ServicerContext) -> bytes:
            return await only(request, context, lambda data: last(data, context))

        return handle_one

    async def handle(request: bytes, context: aio.ServicerContext) -> bytes:
        async def step(index: int, data: bytes) -> bytes:
            if index == len(stages):
                return await last(data, context)
            return await stages[index](data, context, lambda d: step(index + 1, d))

        return await step(0, request)

    return handle


class StageProvider:
    """What a feature (hooks, the v1-only field check) adds to a method's route."""

    def stage_for(self, method: str, client_version: str, backend_version: str) -> Stage | None:
        raise NotImplementedError

    def needed(self, method: str) -> bool:
        """Whether a call of ``method`` starting now has work in this provider's
        stage (asked only for methods it gave a stage). Asked by the frames
        path only: it writes a relayed call to the runtime as it reads it, so
        the call keeps its place among the calls that came before and after
        it. The grpc path relays through a task that a later call may
        overtake; there only the stages keep that order."""
        return True

    def sends_unchanged(self, method: str) -> bool:
        """Whether a call of ``method`` starting now would reach the runtime
        exactly as the client sent it, with nothing to wait for first (asked
        for methods it gave a stage, once ``needed`` said yes). The frames
        path then writes the request as it reads it, and runs the stage beside
        the runtime's work, its context's ``request_sent`` set: the stage
        still sees the call and its answer, and must send the request as it
        came. False unless a provider knows better."""
        return False

    async def settle(self) -> None:
        """Shutdown, once no call is left: finish work that still needs the backend."""
