"""A HookServer start that fails once it has gone past a step (hooks/sdk.py,
hooks/listen.py): a start failing after ``_before_serving`` runs
``_before_release`` under the lock before it lets the lock go, and a grpc
listener bound but never started has its socket file removed, if it is
still the one it bound.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hooks import listen
from hooks.sdk import HookServer, HookServerError
from runtimeproxy.host import socketlock
from tests.unixsockets import socket_mode_fails

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


async def assert_lock_free(path: Path) -> None:
    assert not socketlock.lock_path(path).exists()
    (await asyncio.wait_for(socketlock.claim(path, wait_s=0), WAIT)).release()  # no holder: claimed at once


class Prepared(HookServer):
    """Records its two steps, and whether the socket's lock was held at its release step."""

    def __init__(self, path: Path, **options: Any) -> None:
        super().__init__(path, grace=0, drain=0, **options)
        self.steps: list[str] = []

    async def _before_serving(self) -> None:
        self.steps.append("before_serving")

    async def _before_release(self) -> None:
        held = socketlock.lock_path(Path(self.socket_path)).exists()
        self.steps.append(f"before_release (lock {'held' if held else 'gone'})")


async def test_a_start_failing_after_before_serving_runs_before_release_under_the_lock(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket's mode cannot be set: the start fails with its state
    prepared (before: the lock went without ``_before_release``, so what
    ``_before_serving`` began was left for the next instance to find)."""
    path = sock_dir / "h.sock"
    socket_mode_fails(monkeypatch, path)
    server = Prepared(path)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await server.start()
    assert server.steps == ["before_serving", "before_release (lock held)"]
    assert not server.serving and not path.exists()
    await assert_lock_free(path)


async def test_a_stop_during_a_failed_starts_release_step_waits_for_it(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start failed on its own (the socket's mode), then a stop lands
    in its release step: the step runs to its end, as a stop's own does,
    and the start raises its own error (before: the stop cancelled the
    start, cutting the step, logged as "the stop was cancelled", and the
    start raised "cancelled by a stop", hiding the chmod error)."""
    path = sock_dir / "h.sock"
    releasing, finish, stop_began = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class SlowRelease(Prepared):
        async def _before_stop(self) -> None:
            stop_began.set()  # (the stop goes on to the start, without an await, before the test resumes)

        async def _before_release(self) -> None:
            releasing.set()
            try:
                await finish.wait()
            except asyncio.CancelledError:
                self.steps.append("before_release cut")
                raise
            self.steps.append("before_release ended")

    socket_mode_fails(monkeypatch, path)
    server = SlowRelease(path)
    starting = asyncio.ensure_future(server.start())
    await asyncio.wait_for(releasing.wait(), WAIT)
    stopping = asyncio.ensure_future(server.stop())
    await asyncio.wait_for(stop_began.wait(), WAIT)
    assert not stopping.done()  # it waits for the step
    finish.set()
    await asyncio.wait_for(stopping, WAIT)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await asyncio.wait_for(starting, WAIT)
    assert server.steps == ["before_serving", "before_release ended"]
    await assert_lock_free(path)


@pytest.mark.parametrize("how", ["returned", "handed over"])
async def test_a_write_a_failed_starts_release_step_leaves_keeps_the_lock_until_it_ends(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Guards the failed start's release step (the commit before): a write
    it returns, or hands over and then fails, still running, keeps the
    socket's lock: a start again is refused until it ends, then starts."""
    path = sock_dir / "h.sock"
    write: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    let_go = asyncio.Event()

    class Writes(Prepared):
        async def _before_release(self) -> asyncio.Future[None] | None:
            if how == "returned":
                return write
            self._keep_lock_until(write)
            raise RuntimeError("the step failed after handing over its write")

    socket_mode_fails(monkeypatch, path)
    server = Writes(path)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await server.start()
    monkeypatch.undo()
    assert "Writes failed to start, but keeps its socket's lock until disk I/O" in caplog.text
    assert socketlock.lock_path(path).exists()
    with pytest.raises(HookServerError, match="keeps its socket's lock until a write of its last release step"):
        await server.start()
    write.add_done_callback(lambda _: let_go.set())  # after the SDK's own, which lets the lock go
    write.set_result(None)
    await asyncio.wait_for(let_go.wait(), WAIT)
    assert not socketlock.lock_path(path).exists()
    await asyncio.wait_for(server.start(), WAIT)
    try:
        assert server.serving
    finally:
        await server.stop()


async def test_a_start_cut_by_a_stop_after_before_serving_runs_before_release(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop while the listener opens (before: the cancelled start let the lock go without the step)."""
    path = sock_dir / "h.sock"
    opening = asyncio.Event()

    async def never_opens(*args: object) -> object:
        opening.set()
        await asyncio.Event().wait()  # until the stop cancels the start
        raise AssertionError("not reached")

    monkeypatch.setattr(listen, "open_listener", never_opens)
    server = Prepared(path)
    starting = asyncio.ensure_future(server.start())
    await asyncio.wait_for(opening.wait(), WAIT)
    await asyncio.wait_for(server.stop(), WAIT)
    with pytest.raises(HookServerError, match="cancelled by a stop"):
        await starting
    assert server.steps == ["before_serving", "before_release (lock held)"]
    await assert_lock_free(path)


async def test_a_start_failing_in_before_serving_does_not_run_before_release(sock_dir: Path) -> None:
    """Guards existing behaviour: a ``_before_serving`` that fails prepared nothing to finish."""

    class Failing(Prepared):
        async def _before_serving(self) -> None:
            self.steps.append("before_serving")
            raise RuntimeError("no state")

    path = sock_dir / "h.sock"
    server = Failing(path)
    with pytest.raises(RuntimeError, match="no state"):
        await server.start()
    assert server.steps == ["before_serving"]
    await assert_lock_free(path)


@pytest.fixture
def grpc_start_fails(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """grpc.aio's start raises, once bound; a path put in ``replace`` has a
    newer server's socket bound there first (ours unlinked), kept open."""
    replace: list[Path] = []
    newer: list[socket.socket] = []

    async def start(self: grpc.aio.Server) -> None:
        for path in replace:
            path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            newer.append(sock)
        raise RuntimeError("start failed")

    monkeypatch.setattr(grpc.aio._server.Server, "start", start)
    yield replace
    for sock in newer:
        sock.close()


async def test_a_grpc_listener_bound_but_never_started_has_its_socket_removed(
    sock_dir: Path, grpc_start_fails: list[Path]
) -> None:
    """grpc unlinks its socket at the stop of a server that started only
    (before: the file stayed until the next start's stale check)."""
    path = sock_dir / "h.sock"
    with pytest.raises(RuntimeError, match="start failed"):
        await HookServer(path, transport="grpc").start()
    assert not path.exists()
    await assert_lock_free(path)


async def test_a_socket_another_server_bound_in_place_of_the_never_started_ones_is_kept(
    sock_dir: Path, grpc_start_fails: list[Path]
) -> None:
    """Only the file it bound (its inode): a newer server's socket at the path stays (passes without the
    fix, which removes nothing; it fails if the removal skips the identity check)."""
    path = sock_dir / "h.sock"
    grpc_start_fails.append(path)
    with pytest.raises(RuntimeError, match="start failed"):
        await HookServer(path, transport="grpc").start()
    assert path.is_socket()
