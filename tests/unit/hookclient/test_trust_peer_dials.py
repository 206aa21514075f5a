"""What the frames transport's peer check (SO_PEERCRED, pool._judged) costs
and leaves behind when it refuses: no dial per refused call, no connection
left open. The server's user is played by wrapping the real credential read
(no root needed)."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import uvloop

from runtimeproxy.hookclient import pool
from runtimeproxy.hookclient.connection import ClientConnection
from runtimeproxy.hookclient.endpointtrust import Peer
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import CallFailed, Untrusted

from ...prerequisites import fail_or_skip
from .test_trust_at_dial import METHOD, NOBODY, REQUEST, Counting

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS = 0x1


class Listening:
    """A unix socket server that counts the connections it accepts and keeps
    what each sent until its client closed it."""

    def __init__(self) -> None:
        self.accepted = 0
        self.received: list[bytes] = []
        self.all_closed = asyncio.Event()
        self._open = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._open += 1
        try:
            self.received.append(await reader.read())  # until the client closes its end
        except ConnectionError:  # closed with an abort: a reset, as good as closed
            self.received.append(b"")
        finally:
            writer.close()
            self._open -= 1
            if self._open == 0:
                self.all_closed.set()


def served_by(uid: int, monkeypatch: pytest.MonkeyPatch) -> list[Peer]:
    """Every server connected to is read as running as ``uid`` (the real
    pid, read as the pool reads it); the reads, in order."""
    reads: list[Peer] = []
    real = pool.peer_of

    def as_uid(sock: socket.socket) -> Peer:
        peer = dataclasses.replace(real(sock), uid=uid)
        reads.append(peer)
        return peer

    monkeypatch.setattr(pool, "peer_of", as_uid)
    return reads


def frames_sent(data: bytes) -> list[int]:
    """The frame types a client sent after its preface (none if its close
    dropped what it had not written yet)."""
    if not data:
        return []
    assert data.startswith(PREFACE), data[:24]
    types, at = [], len(PREFACE)
    while at + 9 <= len(data):
        length = int.from_bytes(data[at:at + 3], "big")
        types.append(data[at + 3])
        at += 9 + length
    return types


async def _refused_twenty_times(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listening = Listening()
    server = await asyncio.start_unix_server(listening, str(path))
    reads = served_by(NOBODY, monkeypatch)
    transport = FramesTransport()
    try:
        with pytest.raises(Untrusted, match=f"listened on it as uid {NOBODY}, not root;"):
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
        for _ in range(19):
            with pytest.raises(Untrusted) as err:
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert err.value.reason == (
                f"untrusted endpoint: the server at {path} was pid {os.getpid()} (uid {NOBODY}, not root) "
                f"when last connected, under {pool.PEER_REMEMBERED_S:g} s ago; not dialled again until then unless "
                "its socket changes"
            )
        assert len(reads) == 1, "one dial, then judged by the server remembered for that socket"
        await asyncio.wait_for(listening.all_closed.wait(), 5)
        assert listening.accepted == 1
        assert transport.endpoints() == frozenset()
    finally:
        await transport.close(1)
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_calls_refused_for_their_server_dial_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    """A socket the proxy may call (its own) listened on by a user it may
    not: refused at every call, dialled at the first only (before: each
    refused call dialled again, a connect and a credential read apiece).
    Under uvloop too: its transports hand over their own socket object."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_refused_twenty_times(tmp_path / "h.sock", monkeypatch))


async def test_a_socket_replaced_at_the_path_is_dialled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its server remembered for a socket, not for a path: a new socket
    there (a new listener) is dialled and judged anew. The new one is bound
    while the old still exists, so it cannot get its inode number."""
    path = tmp_path / "h.sock"
    reads = served_by(NOBODY, monkeypatch)
    transport = FramesTransport()
    servers: list[asyncio.Server] = []
    try:
        for name in ("h.sock", "new.sock"):
            servers.append(await asyncio.start_unix_server(Listening(), str(tmp_path / name)))
            if name != "h.sock":
                os.replace(tmp_path / name, path)
            for _ in range(3):
                with pytest.raises(Untrusted):
                    await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
        assert len(reads) == 2
    finally:
        await transport.close(1)
        for server in servers:
            server.close()
            await server.wait_closed()


async def test_a_pooled_connection_refused_for_its_server_is_not_dialled_again_at_each_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody's socket, served by nobody, dialled for nobody's hook file;
    then chowned to root. A hook file of root's finds the connection refused
    for it and the path changed: it dials once, is refused for the server,
    and later calls are refused without a dial (before: every call dialled,
    the refused connection never replacing the pooled one)."""
    if os.geteuid() != 0:
        fail_or_skip("needs root to chown sockets (CI runs as root)")
    reads = served_by(NOBODY, monkeypatch)
    transport = FramesTransport()
    try:
        async with Counting(tmp_path / "h.sock") as server:
            os.chown(server.socket_path, NOBODY, NOBODY)
            await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=NOBODY)
            pooled = transport._connections[server.socket_path]
            os.chown(server.socket_path, 0, 0)
            for _ in range(20):
                with pytest.raises(Untrusted, match=f"(listened on it as uid|[(]uid) {NOBODY}, not root"):
                    await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
            assert len(reads) == 2, "the first dial, then one for the socket as chowned"
            assert transport._connections[server.socket_path] is pooled
            await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=NOBODY)
            assert server.calls == 2
    finally:
        await transport.close(1)


@pytest.mark.parametrize("failure", ["EOPNOTSUPP", "RuntimeError"])
async def test_a_server_whose_user_cannot_be_read_is_not_called_and_its_connection_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """The credential read fails: UNAVAILABLE (an OSError) or the error
    itself (anything else, a bug), no connection kept, no call sent, the
    server's end closed (before: a failure other than OSError left the
    connection open; the OSError case guards existing behaviour)."""
    path = tmp_path / "h.sock"
    listening = Listening()
    server = await asyncio.start_unix_server(listening, str(path))

    def unreadable(sock: socket.socket) -> Peer:
        if failure == "EOPNOTSUPP":
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        raise RuntimeError("a bug")

    monkeypatch.setattr(pool, "peer_of", unreadable)
    transport = FramesTransport()
    try:
        if failure == "EOPNOTSUPP":
            with pytest.raises(CallFailed) as err:
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert err.value.details == f"cannot connect to {path}: cannot tell who serves it"
        else:
            with pytest.raises(RuntimeError, match="a bug"):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
        assert transport.endpoints() == frozenset()
        await asyncio.wait_for(listening.all_closed.wait(), 5)  # the server's end saw it close
        assert listening.accepted == 1
        assert HEADERS not in frames_sent(listening.received[0]), "no call was sent"
    finally:
        await transport.close(1)
        server.close()
        await server.wait_closed()


async def test_a_pooled_connection_refused_for_its_server_is_replaced_by_another_socket_at_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dialled for nobody's hook file, the socket's server nobody's: refused
    for root's file. Another socket bound at the path, by the same owner, in
    the same directory, served by root: root's call dials it, and that
    connection replaces the pooled one (before: the path looked the same as
    dialled, owner and modes alike, so refused without a dial while the
    first server kept its connection)."""
    path = tmp_path / "h.sock"
    uid = [NOBODY]
    real = pool.peer_of
    monkeypatch.setattr(pool, "peer_of", lambda sock: dataclasses.replace(real(sock), uid=uid[0]))
    transport = FramesTransport()
    try:
        async with Counting(path) as first:
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=NOBODY)
            pooled = transport._connections[str(path)]
            with pytest.raises(Untrusted, match=f"listened on it as uid {NOBODY}, not root;"):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            uid[0] = 0
            async with Counting(tmp_path / "new.sock") as second:
                os.replace(tmp_path / "new.sock", path)  # the first server still serves the connection it has
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
                assert transport._connections[str(path)] is not pooled
                await pooled.lost  # replaced: gone once its calls were done
                assert (first.calls, second.calls) == (1, 1)
    finally:
        await transport.close(1)


async def test_a_server_remembered_as_trusted_is_read_again_at_its_next_dial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Called (its server read as root), the connection dropped, then the
    same socket listened on by nobody (a server that called listen() again
    on it): the redial reads the server again and refuses it, the memory
    never admitting. Guards existing behaviour."""
    path = tmp_path / "h.sock"
    uid, reads = [0], []
    real = pool.peer_of

    def as_uid(sock: socket.socket) -> Peer:
        reads.append(peer := dataclasses.replace(real(sock), uid=uid[0]))
        return peer

    monkeypatch.setattr(pool, "peer_of", as_uid)
    transport = FramesTransport()
    try:
        async with Counting(path) as server:
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            pooled = transport._connections[str(path)]
            pooled.close(abort=True)
            await pooled.lost
            uid[0] = NOBODY
            with pytest.raises(Untrusted, match=f"listened on it as uid {NOBODY}, not root;"):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert [peer.uid for peer in reads] == [0, NOBODY]
            assert server.calls == 1
    finally:
        await transport.close(1)


async def test_a_server_refused_for_roots_file_is_dialled_for_its_own_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's socket served by nobody: refused for a hook file of
    root's (nothing pooled after), then called for nobody's file, dialled
    anew: the remembered server refuses only the owners it would at a dial.
    Guards existing behaviour."""
    path = tmp_path / "h.sock"
    reads = served_by(NOBODY, monkeypatch)
    transport = FramesTransport()
    try:
        async with Counting(path) as server:
            with pytest.raises(Untrusted, match=f"listened on it as uid {NOBODY}, not root;"):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert transport.endpoints() == frozenset()
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=NOBODY)
            assert (len(reads), server.calls) == (2, 1)
    finally:
        await transport.close(1)


async def test_a_refused_server_that_listens_again_as_root_is_called_once_its_memory_lapses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused (nobody listens), then the socket listened on again as root
    (a socket-activated server restarted), its inode and change time the
    same: within PEER_REMEMBERED_S still refused without a dial; once that
    passed, dialled, read again and called (before: refused until the socket
    changed or the proxy restarted)."""
    path = tmp_path / "h.sock"
    uid, reads = [NOBODY], []
    real = pool.peer_of

    def as_uid(sock: socket.socket) -> Peer:
        reads.append(peer := dataclasses.replace(real(sock), uid=uid[0]))
        return peer

    monkeypatch.setattr(pool, "peer_of", as_uid)
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    transport = FramesTransport()
    try:
        async with Counting(path) as server:
            with pytest.raises(Untrusted, match=f"listened on it as uid {NOBODY}, not root;"):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            uid[0] = 0
            now[0] += pool.PEER_REMEMBERED_S - 0.5
            with pytest.raises(Untrusted, match="when last connected, under 5 s ago; not dialled again until then"):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert len(reads) == 1
            now[0] += 1.0
            await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
            assert ([peer.uid for peer in reads], server.calls) == ([NOBODY, 0], 1)
    finally:
        await transport.close(1)


async def test_the_oldest_server_remembered_is_forgotten_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sockets' servers kept: a third's forgets the first, which is
    dialled again; the third is still refused without a dial. Guards
    existing behaviour."""
    monkeypatch.setattr(pool, "PEERS_KEPT", 2)
    reads = served_by(NOBODY, monkeypatch)
    paths = [tmp_path / f"{name}.sock" for name in "abc"]
    servers = [await asyncio.start_unix_server(Listening(), str(path)) for path in paths]
    transport = FramesTransport()
    try:
        for path in [*paths, paths[0], paths[2]]:
            with pytest.raises(Untrusted):
                await transport.call(str(path), METHOD, REQUEST, 5, owner_uid=None)
        assert len(reads) == 4, "a, b, c, then a again; c remembered"
    finally:
        await transport.close(1)
        for server in servers:
            server.close()
            await server.wait_closed()


async def test_a_connection_whose_server_was_not_checked_is_not_admitted(tmp_path: Path) -> None:
    """A pooled connection without its socket and server judged (cannot be:
    the pool sets both as it dials) refuses a new hook file owner (before:
    it was admitted unjudged)."""
    conn = ClientConnection(str(tmp_path / "h.sock"), 1 << 20, lambda lost: None)
    with pytest.raises(CallFailed) as err:
        pool._admitted(conn, NOBODY)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert conn.trusted_for == set()


async def test_a_pooled_connection_refused_and_its_socket_changed_to_another_untrusted_one_says_why_for_that(
    tmp_path: Path,
) -> None:
    """Dialled for nobody's hook file on nobody's socket, refused for
    root's; the socket then chowned to another user: refused for who owns it
    now (before: the old connection's reason, naming nobody)."""
    if os.geteuid() != 0:
        fail_or_skip("needs root to chown sockets (CI runs as root)")
    transport = FramesTransport()
    try:
        async with Counting(tmp_path / "h.sock") as server:
            os.chown(server.socket_path, NOBODY, NOBODY)
            await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=NOBODY)
            with pytest.raises(Untrusted, match=f"is owned by uid {NOBODY}, not root"):
                await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
            os.chown(server.socket_path, NOBODY - 1, NOBODY - 1)
            with pytest.raises(Untrusted) as err:
                await transport.call(server.socket_path, METHOD, REQUEST, 5, owner_uid=None)
            assert err.value.reason == (
                f"untrusted endpoint: socket {server.socket_path} is owned by uid {NOBODY - 1}, not root"
            )
            assert err.value.seen.uid == NOBODY - 1
    finally:
        await transport.close(1)
