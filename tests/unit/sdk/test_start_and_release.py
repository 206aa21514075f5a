"""HookServer's start and the last step of its stop (hooks/sdk.py,
hooks/sharedrun.py, hooks/releasestep.py): a start while another is under
way waits for it and shares its outcome, one claim of the socket's lock
between them; a ``_before_release`` that hangs is cut at
``release_step_timeout`` and the lock goes anyway; one that hands back a
write it cannot cut ends the stop but keeps the lock until that write ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest

from hooks.sdk import HookServer, HookServerError
from runtimeproxy.host import socketlock

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


class SlowStart(HookServer):
    """``_before_serving`` waits for ``go``, then fails if ``fail`` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, grace=0, drain=0)
        self.preparing = asyncio.Event()
        self.go = asyncio.Event()
        self.fail: Exception | None = None

    async def _before_serving(self) -> None:
        self.preparing.set()
        await self.go.wait()
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths socketlock.claim was asked for."""
    asked: list[Path] = []
    real = socketlock.claim

    async def claim(path: Path, *args: Any, **kwargs: Any) -> socketlock.SocketLock:
        asked.append(path)
        return await real(path, *args, **kwargs)

    monkeypatch.setattr(socketlock, "claim", claim)
    return asked


async def test_a_second_start_while_the_first_is_under_way_waits_for_it_and_returns(
    sock_dir: Path, claims: list[Path]
) -> None:
    """Before: the second went on to claim the lock the first held, and was
    refused as in use by this very process (or waited on it)."""
    server = SlowStart(sock_dir / "h.sock")
    first = asyncio.ensure_future(server.start())
    await asyncio.wait_for(server.preparing.wait(), WAIT)
    second = asyncio.ensure_future(server.start())
    await asyncio.sleep(0)  # let the second run up to its wait
    assert not second.done()
    server.go.set()
    try:
        await asyncio.wait_for(asyncio.gather(first, second), WAIT)
        assert server.serving
        assert claims == [sock_dir / "h.sock"]
        with pytest.raises(HookServerError, match="already started"):  # after one that ended: as before
            await server.start()
    finally:
        await server.stop()


async def test_a_second_start_shares_the_first_s_failure_and_a_start_after_it_tries_again(
    sock_dir: Path, claims: list[Path]
) -> None:
    server = SlowStart(sock_dir / "h.sock")
    server.fail = RuntimeError("state unreadable")
    first = asyncio.ensure_future(server.start())
    await asyncio.wait_for(server.preparing.wait(), WAIT)
    second = asyncio.ensure_future(server.start())
    await asyncio.sleep(0)
    server.go.set()
    results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), WAIT)
    assert [str(r) for r in results] == ["state unreadable"] * 2
    assert not server.serving and len(claims) == 1
    server.fail = None
    await asyncio.wait_for(server.start(), WAIT)  # the lock was let go: a new start claims it
    await server.stop()


async def test_a_stop_during_a_start_cancels_it(sock_dir: Path) -> None:
    """A SIGTERM handler's stop while the start waits (on the lock, or as
    here in its _before_serving): the start raises, its lock let go, and
    nothing serves (before: the stop returned at once, _server being None
    until the start ended, and the start then served for good)."""
    path = sock_dir / "h.sock"
    server = SlowStart(path)
    first = asyncio.ensure_future(server.start())
    await asyncio.wait_for(server.preparing.wait(), WAIT)
    try:
        await asyncio.wait_for(server.stop(), WAIT)
        with pytest.raises(HookServerError, match=r"the start of the hook server on .* was cancelled by a stop"):
            await asyncio.wait_for(first, WAIT)
        assert not server.serving and not socketlock.lock_path(path).exists()
        assert await server.wait_for_termination(0) is False  # nothing to wait for
    finally:  # without the fix: the start let through, then stopped
        server.go.set()
        first.cancel()
        with contextlib.suppress(BaseException):
            await first
        await server.stop()


async def test_a_cancelled_first_start_fails_the_start_waiting_for_it(sock_dir: Path) -> None:
    """Guards the waiter's outcome (SharedRun runs the start in a task of
    its own now): the caller that began the start is cancelled, its start
    with it; the start waiting for it gets an error, not a cancel it never
    had, and the lock is let go by the time the cancelled call returns."""
    path = sock_dir / "h.sock"
    server = SlowStart(path)
    first = asyncio.ensure_future(server.start())
    await asyncio.wait_for(server.preparing.wait(), WAIT)
    second = asyncio.ensure_future(server.start())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not socketlock.lock_path(path).exists()
    with pytest.raises(HookServerError, match="that this call waited for was cancelled"):
        await asyncio.wait_for(second, WAIT)
    assert not server.serving


class HangingRelease(HookServer):
    release_step_timeout = 0.1

    def __init__(self, path: Path, *, swallow: bool) -> None:
        super().__init__(path, grace=0, drain=0)
        self.swallow = swallow
        self.cut = asyncio.Event()
        self.let_go = asyncio.Event()  # the test's end: a step that swallowed the cancel returns

    async def _before_release(self) -> None:
        try:
            await asyncio.Event().wait()  # a stalled step
        except asyncio.CancelledError:
            self.cut.set()
            if not self.swallow:
                raise
        await self.let_go.wait()


@pytest.mark.parametrize("swallow", [False, True], ids=["cancellable", "swallows-the-cancel"])
async def test_a_release_step_that_hangs_is_cut_and_the_lock_goes_anyway(
    sock_dir: Path, caplog: pytest.LogCaptureFixture, swallow: bool
) -> None:
    """Before: the stop awaited the step with no bound: it never ended, and
    the lock stayed held, so no other instance could start on the path."""
    path = sock_dir / "h.sock"
    server = HangingRelease(path, swallow=swallow)
    await server.start()
    with caplog.at_level(logging.WARNING, logger="hooks.sdk"):
        stopping = asyncio.ensure_future(server.stop())
        try:  # not wait_for: its cancel would wait for a step that swallows it
            await asyncio.wait({stopping}, timeout=WAIT)
            assert stopping.done()
        finally:  # without the bound: the step cut here, so that the test ends
            server.let_go.set()
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
    assert server.cut.is_set()
    assert "HangingRelease's last step before releasing its socket's lock was cut (it did not end within 0.1s)" in caplog.text
    nxt = HookServer(path, grace=0, drain=0)
    await asyncio.wait_for(nxt.start(), WAIT)  # the lock is free: no wait on a holder
    await nxt.stop()


class UncutWrite(HookServer):
    """``_before_release`` hands back a write still running (a thread's, say)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, grace=0, drain=0)
        self.write: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def _before_release(self) -> asyncio.Future[None]:
        return self.write


async def test_a_write_handed_back_keeps_the_lock_past_the_stop_until_it_ends(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = sock_dir / "h.sock"
    released = asyncio.Event()
    real = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        if lock is not None and lock.path == socketlock.lock_path(path):
            released.set()
        real(lock)

    monkeypatch.setattr(socketlock, "release", release)
    server = UncutWrite(path)
    await server.start()
    with caplog.at_level(logging.INFO, logger="hooks.sdk"):
        await asyncio.wait_for(server.stop(), WAIT)  # the stop ends
        assert not released.is_set() and not path.exists()  # its socket gone, its lock kept
        assert "UncutWrite stopped, but keeps its socket's lock until disk I/O it cannot cut has ended" in caplog.text
        with pytest.raises(HookServerError, match="keeps its socket's lock until a write of its last release step"):
            await server.start()
        server.write.set_result(None)
        await asyncio.wait_for(released.wait(), WAIT)
    assert "UncutWrite's last write has ended: its socket's lock goes" in caplog.text
    await asyncio.wait_for(server.start(), WAIT)
    await server.stop()
