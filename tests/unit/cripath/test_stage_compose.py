"""Stages composed in order around the data path's backend call, and a stop's
backend call issued before the next call on its object may go."""

from __future__ import annotations

import asyncio

import pytest

from runtimeproxy.cripath.forward import call_issued, issue
from runtimeproxy.cripath.stage import Send, Stage, compose


def _stage(name: str, seen: list[str]) -> Stage:
    async def stage(request: bytes, context: object, send: Send) -> bytes:
        seen.append(f"{name} {request.decode()} {context}")
        answer = await send(request + name.encode())
        seen.append(f"{name} got {answer.decode()}")
        return answer + name.encode()

    return stage  # type: ignore[return-value]


@pytest.mark.parametrize("count", [0, 1, 2, 3])
async def test_stages_run_in_order_each_sending_on_to_the_next_and_the_last_to_the_backend(count: int) -> None:
    seen: list[str] = []

    async def backend(request: bytes, context: object) -> bytes:
        seen.append(f"backend {request.decode()} {context}")
        return b"A"

    names = ["x", "y", "z"][:count]
    answer = await compose([_stage(n, seen) for n in names], backend)(b"r", "ctx")  # type: ignore[arg-type]
    sent = "r" + "".join(names)
    assert answer == b"A" + "".join(reversed(names)).encode()
    assert seen == (
        [f"{n} r{''.join(names[:i])} ctx" for i, n in enumerate(names)]
        + [f"backend {sent} ctx"]
        + [f"{n} got A{''.join(reversed(names[i + 1:]))}" for i, n in reversed(list(enumerate(names)))]
    )


async def test_a_stage_that_refuses_never_reaches_the_backend() -> None:
    reached: list[bytes] = []

    async def refuse(request: bytes, context: object, send: Send) -> bytes:
        raise PermissionError("no")

    async def backend(request: bytes, context: object) -> bytes:
        reached.append(request)
        return b""

    with pytest.raises(PermissionError):
        await compose([refuse], backend)(b"r", None)  # type: ignore[list-item, arg-type]
    assert reached == []


@pytest.mark.parametrize("notifies", [True, False])
async def test_a_stop_is_issued_once_its_relay_says_so_or_its_call_ended(notifies: bool) -> None:
    """A relay that says when the request went lets the caller go then, with
    the call still under way; one that never says so, once the call ended."""
    events: list[str] = []
    answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def relay(request: bytes) -> bytes:
        notify = call_issued.get()
        if notifies and notify is not None:
            events.append("sent")
            notify()
            return await answer
        events.append("ended")
        return b"stopped"

    backend_call = await asyncio.wait_for(issue(relay, b"stop"), 5)
    events.append("issued")
    assert events == ["sent" if notifies else "ended", "issued"]
    assert backend_call.done() is not notifies
    answer.set_result(b"stopped")
    assert await backend_call == b"stopped"


async def test_a_stop_whose_client_left_before_it_was_issued_is_cancelled_at_the_runtime() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def never_issued(request: bytes) -> bytes:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    issuing = asyncio.ensure_future(issue(never_issued, b"stop"))
    await asyncio.wait_for(started.wait(), 5)
    issuing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await issuing
    await asyncio.wait_for(cancelled.wait(), 5)
