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


async def _until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def test_a_burst_is_accepted_whole_over_several_turns(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    taken: list[socket.socket] = []
    acc = Acceptor(bound_socket(str(path)), taken.append)
    clients = _connect(path, acceptor.BATCH + 20)
    acc.start()
    await _until(lambda: len(taken) == len(clients))
    assert all(not s.getblocking() for s in taken)
    acc.close()
    assert path.exists()  # closing never unlinks the path (systemd's socket)
    for s in taken + clients:
        s.close()


async def test_a_stop_in_the_callback_leaves_the_rest_in_the_backlog(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    listening = bound_socket(str(path))
    taken: list[socket.socket] = []

    def take(conn: socket.socket) -> None:
        taken.append(conn)
        acc.stop()

    acc = Acceptor(listening, take)
    clients = _connect(path, 3)
    acc.start()
    await _until(lambda: len(taken) == 1)
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

    def accept(self) -> tuple[socket.socket, object]:
        self.accepts += 1
        if self.accepts == 1:
            raise OSError(self._error, os.strerror(self._error))
        return self._sock.accept()

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


@pytest.mark.parametrize("error", [errno.EMFILE, errno.EINVAL])
async def test_a_failing_accept_pauses_then_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int) -> None:
    monkeypatch.setattr(acceptor, "RETRY_S", 0.2)
    path = tmp_path / "s.sock"
    failing = _Failing(bound_socket(str(path)), error)
    taken: list[socket.socket] = []
    acc = Acceptor(failing, taken.append)  # type: ignore[arg-type]
    clients = _connect(path, 1)
    acc.start()
    await _until(lambda: failing.accepts == 1)
    await asyncio.sleep(0.1)
    assert failing.accepts == 1 and taken == []  # paused: the loop is not spun on the error
    await _until(lambda: len(taken) == 1)
    acc.close()
    for s in taken + clients:
        s.close()
