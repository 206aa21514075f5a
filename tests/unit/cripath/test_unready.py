"""cripath/unready.py: the Status re-check an Unready runs while the runtime
does not serve: one task per episode, ended by ready() or close(), none
started after close(), run in a context of its own, and surviving a Status
that cannot be asked."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from runtimeproxy.cripath import unreachable
from runtimeproxy.cripath.unready import Unready, not_initialized

SOCKET = Path("/run/containerd/containerd.sock")


class Status:
    """The runtime's Status, answered as the test says: each ask waits for
    the next of ``answers`` (True, False, or an exception to raise)."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[bool | Exception] = asyncio.Queue()
        self.asked = 0
        self.gates: list[object] = []  # runtime_gate as each ask saw it
        self.waiting = asyncio.Event()

    async def __call__(self) -> bool:
        self.asked += 1
        self.gates.append(unreachable.runtime_gate.get())
        self.waiting.set()
        answer = await self.answers.get()
        self.waiting.clear()
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def asked_once_more(self) -> None:
        async with asyncio.timeout(5):
            await self.waiting.wait()


def _unready(status: Status) -> Unready:
    return Unready(SOCKET, status, recheck_s=0)


def _lost(status: Status) -> tuple[Unready, asyncio.Task[None]]:
    """An Unready that saw the runtime lost, and its recheck task."""
    unready = _unready(status)
    unready.saw("it was lost")
    task = unready._task
    assert task is not None
    return unready, task


async def test_one_recheck_task_per_episode_and_ready_ends_it() -> None:
    status = Status()
    unready = _unready(status)
    unready.saw("it answers 'server is not initialized yet'")
    task = unready._task
    assert task is not None and not task.done()
    unready.saw("it answers 'server is not initialized yet'")  # the same episode: no second task
    assert unready._task is task
    await status.asked_once_more()
    unready.ready()  # a probe answered meanwhile
    assert unready.reason is None and unready._task is None
    await asyncio.wait([task])
    assert task.cancelled() and status.asked == 1
    unready.saw("it was lost")  # a new episode: a new task
    assert unready._task is not None and unready._task is not task
    unready.close()


async def test_the_recheck_ends_the_episode_when_status_answers() -> None:
    status = Status()
    unready, task = _lost(status)
    await status.answers.put(False)  # not yet
    await status.answers.put(True)
    async with asyncio.timeout(5):
        await task
    assert unready.reason is None and status.asked == 2


async def test_a_status_that_cannot_be_asked_is_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "runtimeproxy.cripath.unready")
    status = Status()
    unready, task = _lost(status)
    await status.answers.put(RuntimeError("the channel is closed"))
    await status.answers.put(True)
    async with asyncio.timeout(5):
        await task
    assert unready.reason is None and status.asked == 2
    assert any(r.message == "the runtime's Status could not be asked" and r.exc_info for r in caplog.records)


async def test_close_ends_the_recheck_and_no_later_saw_starts_one() -> None:
    status = Status()
    unready, task = _lost(status)
    await status.asked_once_more()
    unready.close()
    await asyncio.wait([task])
    assert task.cancelled()
    unready.ready()
    unready.saw("it answers 'server is not initialized yet'")  # a call's answer after the backend closed
    assert unready.reason is not None  # still refused: the backend is closed
    assert unready._task is None and status.asked == 1


async def test_the_recheck_does_not_carry_the_calls_context() -> None:
    """saw() is called from a hooked call's task: its runtime_gate is that call's, not the re-check's."""
    status = Status()
    unready = _unready(status)

    async def a_hooked_call() -> None:
        unreachable.runtime_gate.set(object())  # type: ignore[arg-type]
        unready.saw("it answers 'server is not initialized yet'")

    await asyncio.create_task(a_hooked_call())
    await status.asked_once_more()
    assert status.gates == [None]
    unready.close()


@pytest.mark.parametrize(("status", "message", "expected"), [
    (2, "server is not initialized yet", True),  # containerd 1.6, 1.7
    (14, "server is not initialized yet: unavailable", True),  # containerd 2.x
    (2, "failed to pull image: image not found", False),
    (14, "connection refused", False),
    (13, "server is not initialized yet", False),  # another status: not the CRI plugin's gate
])
def test_not_initialized(status: int, message: str, expected: bool) -> None:
    assert not_initialized(status, message) is expected


def _recovery(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("the runtime serves calls")]


def test_a_runtime_that_never_served_serves_now_and_one_that_did_serves_again(caplog: pytest.LogCaptureFixture) -> None:
    """A runtime still loading its state at the proxy's start never served:
    its recovery is not 'again' (before: it was)."""
    caplog.set_level(logging.DEBUG, "runtimeproxy.cripath.unready")
    unready = Unready(SOCKET)
    unready.saw("it answers 'server is not initialized yet'")
    unready.ready()
    unready.saw("it was lost")
    unready.ready()
    assert _recovery(caplog) == [(logging.INFO, "the runtime serves calls now: hooked calls go on"),
                                 (logging.INFO, "the runtime serves calls again: hooked calls go on")]


def test_a_probe_that_answered_first_makes_the_next_recovery_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "runtimeproxy.cripath.unready")
    unready = Unready(SOCKET)
    unready.ready()  # the backend's first probe: no episode, but it served
    unready.saw("it was lost", logging.DEBUG)
    unready.ready()
    assert _recovery(caplog) == [(logging.DEBUG, "the runtime serves calls again: hooked calls go on")]


def test_a_sighting_at_debug_that_was_warned_of_elsewhere_ends_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """frames/silent.py warns itself and tells Unready at DEBUG: its end is
    still an INFO line (before: DEBUG, so the warning had no visible end)."""
    caplog.set_level(logging.DEBUG, "runtimeproxy.cripath.unready")
    unready = Unready(SOCKET)
    unready.saw("it sent no SETTINGS", logging.DEBUG, recovery=logging.INFO)
    unready.ready()
    unready.saw("it was lost", logging.DEBUG)  # the backend's loss: its own lines
    unready.saw("it sent no SETTINGS", logging.DEBUG, recovery=logging.INFO)  # the same episode, warned of
    unready.ready()
    unready.saw("it was lost", logging.DEBUG)
    unready.ready()
    starts = [r.levelno for r in caplog.records if r.getMessage().startswith("the runtime does not serve")]
    assert starts == [logging.DEBUG] * 3
    assert [level for level, _ in _recovery(caplog)] == [logging.INFO, logging.INFO, logging.DEBUG]
