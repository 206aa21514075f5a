"""The acceptor: every accepted socket is handed over, a stop leaves the
rest in the backlog, a failing accept pauses instead of spinning the loop."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from pathlib import Path

import pytest

from runtimeproxy.host import acceptor
from runtimeproxy.host.acceptor import Acceptor, bound_socket


def _connect(path: Path, count: int) -> list[socket.socket]:
    clients = []
    for _ in range(count):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path))  # completes into the backlog
        clients.append(client)
    return clients


class _Taken(list[socket.socket]):
    """The acceptor's callback: keeps each socket handed over, and wakes
    ``reaches`` on each, so that tests await them instead of polling."""

    def __init__(self) -> None:
        super().__init__()
        self._more = asyncio.Event()

    def __call__(self, conn: socket.socket) -> None:
        self.append(conn)
        self._more.set()

    async def reaches(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self) < count:
                self._more.clear()  # (no await since the check: nothing was handed over in between)
                await self._more.wait()


async def test_a_burst_is_accepted_whole_over_several_turns(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    taken = _Taken()
    acc = Acceptor(bound_socket(str(path)), taken)
    clients = _connect(path, acceptor.BATCH + 20)
    acc.start()
    await taken.reaches(len(clients))
    assert all(not s.getblocking() for s in taken)
    acc.close()
    assert path.exists()  # closing never unlinks the path (systemd's socket)
    for s in taken + clients:
        s.close()


async def test_a_stop_in_the_callback_leaves_the_rest_in_the_backlog(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    listening = bound_socket(str(path))
    taken = _Taken()

    def take(conn: socket.socket) -> None:
        taken(conn)
        acc.stop()

    acc = Acceptor(listening, take)
    clients = _connect(path, 3)
    acc.start()
    await taken.reaches(1)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(taken) == 1
    acc.start()  # a stopped acceptor stays stopped
    await asyncio.sleep(0.05)
    assert len(taken) == 1
    left = [listening.accept()[0] for _ in range(2)]  # the next instance's, still there
    for s in taken + left + clients:
        s.close()
    listening.close()


class _Failing:
    """A listening socket whose first accept fails as a broken one would."""

    def __init__(self, sock: socket.socket, error: int) -> None:
        self._sock, self._error = sock, error
        self.accepts = 0
        self.failed = asyncio.Event()  # set as its first accept fails

    def accept(self) -> tuple[socket.socket, object]:
        self.accepts += 1
        if self.accepts == 1:
            self.failed.set()
            raise OSError(self._error, os.strerror(self._error))
        return self._sock.accept()

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


@pytest.mark.parametrize("error", [errno.EMFILE, errno.EINVAL])
async def test_a_failing_accept_pauses_then_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int) -> None:
    """The retry is run by hand: RETRY_S is long, so no late loop reaches it
    while the pause is checked (before: 0.2 s, and the check came 0.1 s in)."""
    monkeypatch.setattr(acceptor, "RETRY_S", 30)
    path = tmp_path / "s.sock"
    failing = _Failing(bound_socket(str(path)), error)
    taken = _Taken()
    acc = Acceptor(failing, taken)  # type: ignore[arg-type]
    clients = _connect(path, 1)
    acc.start()
    await asyncio.wait_for(failing.failed.wait(), 5)
    # The reader is level-triggered (epoll, no EPOLLET): one still registered
    # runs again on the next turn while the connection waits in the backlog.
    for _ in range(3):
        await asyncio.sleep(0)
    assert failing.accepts == 1 and taken == []  # paused: the loop is not spun on the error
    retry = acc._retry
    assert retry is not None and retry.when() - asyncio.get_running_loop().time() > 20  # in RETRY_S
    callback, args = retry._callback, retry._args  # type: ignore[attr-defined]  # (cancel() forgets them)
    retry.cancel()
    callback(*args)  # its time come
    await taken.reaches(1)
    acc.close()
    for s in taken + clients:
        s.close()
