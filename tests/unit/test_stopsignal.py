"""StopSignal.unless_signalled: a start-up a stop signal (or StopSignal.end) cuts short."""

from __future__ import annotations

import asyncio
import logging
import signal

import pytest

from runtimeproxy.stopsignal import StopSignal, _on_stop_signal


async def test_a_start_that_fails_as_the_signal_cancels_it_is_logged_and_ends_as_signalled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = StopSignal()
    entered = asyncio.Event()

    async def start() -> str:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("injected: undoing the start failed") from None
        return "started"

    waiting = asyncio.ensure_future(stop.unless_signalled(start()))
    await entered.wait()
    stop.received = "SIGTERM"
    stop.set()
    with caplog.at_level(logging.WARNING, "runtimeproxy.stopsignal"):
        assert await waiting is None  # the stop goes on, as after any signal during start-up
    (record,) = [r for r in caplog.records if r.name == "runtimeproxy.stopsignal"]
    assert record.levelno == logging.WARNING and "injected" in record.error  # type: ignore[attr-defined]
    assert record.getMessage() == "start-up cut short; undoing it failed"
    assert record.cut_by == "signal SIGTERM"  # type: ignore[attr-defined]


async def test_a_start_that_fails_as_an_end_cancels_it_is_logged_as_cut_by_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: logged with `signal: None` (a private containerd's exit cut it short)."""
    stop = StopSignal()
    entered = asyncio.Event()

    async def start() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("injected: undoing the start failed") from None

    waiting = asyncio.ensure_future(stop.unless_signalled(start()))
    await entered.wait()
    stop.end("the private containerd exited")
    with caplog.at_level(logging.WARNING, "runtimeproxy.stopsignal"):
        assert await waiting is None
    (record,) = [r for r in caplog.records if r.name == "runtimeproxy.stopsignal"]
    assert record.cut_by == "the private containerd exited"  # type: ignore[attr-defined]
    assert not hasattr(record, "signal")


async def test_a_start_that_fails_on_its_own_raises() -> None:
    async def start() -> None:
        raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        await StopSignal().unless_signalled(start())


async def test_a_caller_cancelled_while_it_waits_ends_once_the_start_has_undone_its_steps() -> None:
    entered = asyncio.Event()
    undone: list[bool] = []

    async def start() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:  # undoing takes loop turns (a server's stop, say)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            undone.append(True)

    waiting = asyncio.ensure_future(StopSignal().unless_signalled(start()))
    await entered.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert undone == [True]


async def test_a_start_ends_as_cut_short_when_an_end_comes_first() -> None:
    """A private containerd's exit while the proxy starts: ``end``."""
    stop = StopSignal()
    entered, undone = asyncio.Event(), []

    async def start() -> str:
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            undone.append(True)
        return "started"

    waiting = asyncio.ensure_future(stop.unless_signalled(start()))
    await entered.wait()
    stop.end("the private containerd exited")
    assert await waiting is None
    assert undone == [True] and (stop.received, stop.reason) == (None, "the private containerd exited")


def test_an_end_after_a_signal_or_another_end_changes_nothing() -> None:
    stop = StopSignal()
    _on_stop_signal(stop, signal.SIGTERM)
    stop.end("the private containerd exited")
    assert (stop.received, stop.reason) == ("SIGTERM", None)
    ended = StopSignal()
    ended.end("first")
    ended.end("second")
    assert ended.is_set() and ended.reason == "first"


def test_a_stop_signal_is_logged_in_one_line_and_a_second_one_as_such(caplog: pytest.LogCaptureFixture) -> None:
    """Before: `stop signal received` for each, then serve and hook run logged
    `signal received, shutting down` of their own."""
    stop = StopSignal()
    with caplog.at_level(logging.INFO, "runtimeproxy.stopsignal"):
        _on_stop_signal(stop, signal.SIGTERM)
        _on_stop_signal(stop, signal.SIGINT)
    assert [(r.getMessage(), r.signal) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("signal received, shutting down", "SIGTERM"), ("signal received, already shutting down", "SIGINT")]
    assert stop.is_set() and stop.received == "SIGTERM"
