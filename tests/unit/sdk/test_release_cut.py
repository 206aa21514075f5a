"""The last step of a HookServer's stop cut short (hooks/sdk.py,
hooks/releasestep.py, socketlock.release_once_stopped): a stop cancelled
during ``_before_release``, or a step that raises CancelledError itself,
lets the lock go as the timeout does; a write handed back that is
cancelled, not ended, keeps the lock until the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from hooks.sdk import HookServer, HookServerError
from runtimeproxy.host import socketlock

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The lock files socketlock.release let go of."""
    files: list[Path] = []
    real = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        if lock is not None and lock.held:
            files.append(lock.path)
        real(lock)

    monkeypatch.setattr(socketlock, "release", release)
    return files


class StalledRelease(HookServer):
    def __init__(self, path: Path) -> None:
        super().__init__(path, grace=0, drain=0)
        self.in_step = asyncio.Event()

    async def _before_release(self) -> None:
        self.in_step.set()
        await asyncio.Event().wait()


async def test_a_stop_cancelled_in_its_release_step_lets_the_lock_go(
    sock_dir: Path, released: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the cancel went through release_once_stopped as a failed
    server stop ("server not stopped"), the lock kept until the process
    exited: a next start in this process waited on it and was refused."""
    path = sock_dir / "h.sock"
    server = StalledRelease(path)
    await server.start()
    with caplog.at_level(logging.WARNING):
        stopping = asyncio.ensure_future(server.stop())
        await asyncio.wait_for(server.in_step.wait(), WAIT)
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
    assert released == [socketlock.lock_path(path)] and not path.exists()
    assert "server not stopped" not in caplog.text
    assert "was cut (the stop was cancelled)" in caplog.text
    nxt = HookServer(path, grace=0, drain=0)
    await asyncio.wait_for(nxt.start(), WAIT)  # at once: the lock is free
    await nxt.stop()


class CancelsItself(HookServer):
    async def _before_release(self) -> None:
        raise asyncio.CancelledError  # (a cancel of something it awaited, let through)


async def test_a_release_step_raising_cancelled_error_is_a_failed_step(
    sock_dir: Path, released: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the CancelledError, not an Exception, escaped the step's
    bound: the stop raised it and the lock stayed held until exit."""
    path = sock_dir / "h.sock"
    server = CancelsItself(path, grace=0, drain=0)
    await server.start()
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(server.stop(), WAIT)  # no CancelledError out of a stop nobody cancelled
    assert released == [socketlock.lock_path(path)]
    assert "CancelsItself's last step before releasing its socket's lock failed" in caplog.text


class HandsBack(HookServer):
    def __init__(self, path: Path) -> None:
        super().__init__(path, grace=0, drain=0)
        self.write: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def _before_release(self) -> asyncio.Future[None]:
        return self.write


async def test_a_write_handed_back_then_cancelled_keeps_the_lock(
    sock_dir: Path, released: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio.run's end cancels every task left: a Task wrapping a thread's
    write is cancelled while the thread still writes (before: the lock went
    on the cancel, logged as "last write has ended")."""
    path = sock_dir / "h.sock"
    server = HandsBack(path)
    await server.start()
    with caplog.at_level(logging.INFO):
        await asyncio.wait_for(server.stop(), WAIT)
        server.write.cancel()
        await asyncio.sleep(0)  # its callbacks run
    assert released == []
    assert "last write has ended" not in caplog.text
    assert "the write kept waiting for was cancelled, not ended" in caplog.text
    with pytest.raises(HookServerError, match="until this process exits"):
        await server.start()
    assert socketlock.lock_path(path).exists()
    socketlock.release(server._path_lock)  # the process's exit, for this test's


async def test_the_lock_file_s_stop_bound_counts_the_release_step(sock_dir: Path) -> None:
    """A waiting instance waits as long as the stop may keep the lock: its
    grace, 1 s to close, and the release step's bound (before: the step's
    5 s were left out, and a waiter gave up while it still ran)."""
    path = sock_dir / "h.sock"
    server = StalledRelease(path)
    server.release_step_timeout = 40.0
    server._grace = 30.0
    await server.start()
    try:
        assert "stop_s=71" in socketlock.lock_path(path).read_text()
    finally:
        server.release_step_timeout = 0.01
        await server.stop(0)


class HandsOverThenHangs(HookServer):
    def __init__(self, path: Path) -> None:
        super().__init__(path, grace=0, drain=0)
        self.write: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.in_step = asyncio.Event()

    async def _before_release(self) -> None:
        self._keep_lock_until(self.write)
        self.in_step.set()
        await asyncio.Event().wait()


@pytest.mark.parametrize("cut_by", ["release_step_timeout", "a cancelled stop"])
async def test_a_write_handed_over_keeps_the_lock_when_the_step_is_cut(
    sock_dir: Path, released: list[Path], cut_by: str
) -> None:
    """_keep_lock_until: a step cut after it handed over its write (its
    bound, or the stop cancelled) keeps the lock until the write ends
    (before: only a write the step returned kept it)."""
    path = sock_dir / "h.sock"
    server = HandsOverThenHangs(path)
    server.release_step_timeout = 0.05 if cut_by == "release_step_timeout" else 30.0
    await server.start()
    stopping = asyncio.ensure_future(server.stop())
    if cut_by == "a cancelled stop":
        await asyncio.wait_for(server.in_step.wait(), WAIT)
        stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(stopping, WAIT)
    assert released == []
    server.write.set_result(None)
    await asyncio.sleep(0)  # its callbacks run
    assert released == [socketlock.lock_path(path)]


class ReturnsFailed(HookServer):
    async def _before_release(self) -> asyncio.Future[None]:
        write: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        write.set_exception(OSError(5, "Input/output error"))
        return write


@pytest.mark.parametrize("when", ["kept", "already done"])
async def test_a_write_that_fails_is_logged_as_failed(
    sock_dir: Path, released: list[Path], caplog: pytest.LogCaptureFixture, when: str
) -> None:
    """A write handed back that fails, while it keeps the lock or before the
    step returned it: a warning naming the error, the lock let go (before:
    logged as "last write has ended", its exception never retrieved)."""
    path = sock_dir / "h.sock"
    server = HandsBack(path) if when == "kept" else ReturnsFailed(path, grace=0, drain=0)
    await server.start()
    with caplog.at_level(logging.INFO):
        await asyncio.wait_for(server.stop(), WAIT)
        if isinstance(server, HandsBack):
            server.write.set_exception(OSError(5, "Input/output error"))
            await asyncio.sleep(0)  # its callbacks run
    assert released == [socketlock.lock_path(path)]
    failed = [r for r in caplog.records if "last write failed" in r.getMessage()]
    assert [r.levelno for r in failed] == [logging.WARNING] and "Input/output error" in failed[0].error
    assert "last write has ended" not in caplog.text
