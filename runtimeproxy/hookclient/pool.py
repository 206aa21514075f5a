"""Hook calls on the proxy's own HTTP/2 connections (the frames data path's transport)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Collection

import grpc

from .endpointtrust import (PEER_REMEMBERED_S, Peer, SocketSeen, judge, judge_peer, look, peer_of, require_connected,
                            require_peer, require_trusted)
from .connection import ClientConnection
from .deadlines import Deadlines
from .stream import Unprocessed
from .headers import request_block_prefix, with_timeout
from .transport import MAX_MESSAGE_BYTES, CallFailed, Untrusted

# A unix socket address holds at most 107 bytes of path (sun_path, with its NUL).
SUN_PATH_MAX = 107
ATTEMPTS = 2  # a call the server did not process (GOAWAY, REFUSED_STREAM) is sent once more, as grpc does
PEERS_KEPT = 256  # sockets whose listener is remembered (the oldest forgotten first)


class FramesTransport:
    """One connection per endpoint, opened at the first call and again after
    it closed. A server that is down costs each call one failed connect,
    which on a unix socket is immediate: there is no backoff to wait out once
    it is back."""

    def __init__(self, max_message: int = MAX_MESSAGE_BYTES) -> None:
        self._max_message = max_message
        self._connections: dict[str, ClientConnection] = {}
        self._connecting: dict[str, asyncio.Task[ClientConnection]] = {}
        self._blocks: dict[str, bytes] = {}  # a method's request headers but the timeout
        self._closers: set[asyncio.Task[None]] = set()
        # Connects under way to an endpoint that was removed, and the grace their calls get.
        self._forgotten: set[asyncio.Task[ClientConnection]] = set()
        self._forgotten_grace = 0.0
        self._live: set[ClientConnection] = set()  # every open connection, the replaced ones included
        self._retiring: set[ClientConnection] = set()  # each has its task in _closers
        self._kept: set[str] | None = None  # the endpoints of the last keep_only (None: any)
        self._closing = False
        self._deadlines = Deadlines()  # every call's, on one timer
        # Who listened on each socket dialled (by SocketSeen.identity), used
        # only to refuse without a connect (_connect), never to admit: calls
        # refused for their server cost no dial each. It can go stale, only
        # towards refusing: SO_PEERCRED is reset at every listen(), which
        # leaves the inode and change time alone (a server listening again
        # on the socket it was handed, as another user), and a socket
        # replaced by one on the inode number it freed, within the change
        # time's granularity, looks the same. Either is refused as before
        # until the socket changes (chmod) or is forgotten: PEER_REMEMBERED_S
        # after its dial, or pushed out past PEERS_KEPT.
        self._peers: dict[tuple[int, int, int], tuple[Peer, float]] = {}

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        if len(request) > self._max_message:
            raise CallFailed(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"hook request of {len(request)} bytes is over the limit of {self._max_message}",
            )
        prefix = self._blocks.get(method)
        if prefix is None:
            prefix = self._blocks[method] = request_block_prefix(method)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            with self._deadlines.bound(deadline):
                for attempt in range(1, ATTEMPTS + 1):
                    conn = self._open(endpoint, owner_uid) or await self._connection(endpoint, owner_uid)
                    try:
                        return await conn.call(with_timeout(prefix, deadline - loop.time()), request)
                    except Unprocessed:
                        if attempt == ATTEMPTS:
                            raise
        except TimeoutError as err:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from err
        raise AssertionError("unreachable")

    def _open(self, endpoint: str, owner_uid: int | None) -> ClientConnection | None:
        """The endpoint's connection if a call may start on it now (``_connection``'s
        first case, without a coroutine: nearly every call's): its socket was
        judged when it was dialled, and found trusted for this hook file's owner."""
        conn = self._connections.get(endpoint)
        if (conn is None or not conn.usable or owner_uid not in conn.trusted_for or self._closing
                or (self._kept is not None and endpoint not in self._kept)):
            return None
        return conn

    async def _connection(self, endpoint: str, owner_uid: int | None) -> ClientConnection:
        if self._closing:
            raise CallFailed(grpc.StatusCode.CANCELLED, "hook connections are closing (the proxy is stopping)")
        if self._kept is not None and endpoint not in self._kept:
            # A call that began before its server was removed, and lost its connection to that.
            raise CallFailed(grpc.StatusCode.CANCELLED, "hook server was removed while the call was under way")
        conn = self._connections.get(endpoint)
        if conn is not None and conn.usable:
            try:
                return _admitted(conn, owner_uid)
            except Untrusted:
                # Refused by the socket as it was dialled. Another socket at
                # the path since, or this one chowned (SocketSeen compares
                # inode and change time), and trusted for this owner there:
                # dialled anew, the new connection replacing this one, for
                # every owner (the others judged for it at their next call;
                # this one closes once its calls are done). Unchanged:
                # refused as before; changed but untrusted: refused for the
                # socket there now; both without a dial. One whose server
                # was refused before, by _connect without a dial too.
                seen = look(endpoint)
                if seen is None or seen == conn.socket:
                    raise
                if (reason := judge(seen, owner_uid)) is not None:  # why the socket there now is refused
                    raise Untrusted(reason, seen) from None
        while True:
            task = self._connecting.get(endpoint)
            if task is None or task.done():
                task = self._connecting[endpoint] = asyncio.get_running_loop().create_task(
                    self._connect(endpoint, owner_uid)
                )
                task.add_done_callback(lambda done: self._connected(endpoint, done))
            try:
                # Shielded: one caller's deadline does not fail the others' connect.
                conn = await asyncio.shield(task)
            except CallFailed as err:  # one exception per caller: each raise adds to its traceback
                raise CallFailed(err.code, err.details) from None
            except Untrusted as err:
                # Refused for the hook file owner that dialled, maybe not
                # this call's (another file on the same endpoint): judged for
                # ours, by the same socket and server. Trusted for us, we dial our own.
                untrusted = judge(err.seen, owner_uid)
                if untrusted is None and err.peer is not None:
                    untrusted = judge_peer(err.peer, owner_uid, endpoint, err.remembered)
                if untrusted is None:
                    continue
                raise Untrusted(untrusted, err.seen, err.peer, err.remembered) from None
            return _admitted(conn, owner_uid)  # dialled for another caller, maybe for another hook file's owner

    async def _connect(self, endpoint: str, owner_uid: int | None) -> ClientConnection:
        """A new connection, its socket judged before it is dialled: refused
        (``Untrusted``) without a connect if it may not be called. Once
        connected, before any call, the server that answered is judged too
        (``require_peer``): a socket swapped in at the path since the look is
        refused, and the connection closed."""
        seen = look(endpoint)
        require_trusted(seen, owner_uid)
        loop = asyncio.get_running_loop()
        if seen is not None and (known := self._peers.get(seen.identity)) is not None:
            peer, dialled_at = known
            if loop.time() - dialled_at < PEER_REMEMBERED_S:
                # The socket dialled lately (the same inode, unchanged since),
                # its listener then refused without a dial; trusted, it is
                # dialled and read again (one may have listened again since: see _peers).
                require_peer(peer, seen, owner_uid, endpoint, remembered=True)
        # The socket judged, not the endpoint: a symlinked endpoint's chain is
        # followed once, by look(), and links in between (which are not judged)
        # retargeted since cannot change what is dialled. A judged path too long
        # for a unix address (a short link to a deep directory) cannot be
        # dialled as such: the endpoint is, its chain followed afresh.
        target = endpoint if seen is None or len(os.fsencode(seen.path)) > SUN_PATH_MAX else seen.path
        try:
            transport, conn = await loop.create_unix_connection(
                lambda: ClientConnection(endpoint, self._max_message, self._lost), target
            )
        except OSError as err:
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {endpoint}: {err.strerror or err}") from err
        try:
            seen, peer = self._judged(endpoint, seen, transport, owner_uid)
        except BaseException:
            # No call was made on it (our preface written, maybe a SETTINGS
            # or PING ACK after it): closed, whatever failed the checks.
            conn.close(abort=True)
            raise
        conn.socket, conn.peer = seen, peer
        conn.trusted_for.add(owner_uid)
        return conn

    def _judged(
        self, endpoint: str, seen: SocketSeen | None, transport: asyncio.BaseTransport, owner_uid: int | None
    ) -> tuple[SocketSeen, Peer]:
        """The socket (``seen``: as looked at before the connect) and the
        server a new connection is to, once both are judged; ``Untrusted``
        or ``CallFailed`` if it may not be called."""
        peer = _peer(transport)
        if peer is None:  # who answers cannot be told, so it is not trusted
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {endpoint}: cannot tell who serves it")
        if seen is None:  # none there when looked at, yet connected: judge the one that appeared
            seen = look(endpoint)
            if seen is None:
                # Gone again (or replaced as we looked): there is nothing to
                # judge what we are connected to by, so it is not trusted.
                raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {endpoint}: socket vanished as it was dialled")
        # Remembered for the socket judged. One swapped in before the connect
        # leaves its server remembered for the socket it replaced: at worst a
        # refusal of that one, gone from the path.
        peers = self._peers
        peers.pop(seen.identity, None)
        if len(peers) >= PEERS_KEPT:
            del peers[next(iter(peers))]
        peers[seen.identity] = (peer, asyncio.get_running_loop().time())
        require_connected(seen, peer, owner_uid, endpoint)
        return seen, peer

    def _connected(self, endpoint: str, task: asyncio.Task[ClientConnection]) -> None:
        current = self._connecting.get(endpoint) is task
        if current:
            del self._connecting[endpoint]
        self._forgotten.discard(task)
        if task.cancelled() or task.exception() is not None:  # read: not "never retrieved" if nobody waits
            return
        conn = task.result()
        if conn.closed:  # lost before this ran: _lost had nothing to take it out of
            return
        self._live.add(conn)
        if current:
            # One it replaces is going away: it closes itself after its last
            # call (each bounded by its timeout), or in close() at the latest;
            # told to if it was still usable (refused for a hook file's owner
            # whose socket was put right since, see _connection).
            replaced = self._connections.get(endpoint)
            self._connections[endpoint] = conn
            if replaced is not None and replaced is not conn:
                replaced.go_away()
        else:  # its endpoint was removed while it connected
            self._retire(conn, self._forgotten_grace)

    def _lost(self, conn: ClientConnection) -> None:
        if self._connections.get(conn.endpoint) is conn:
            del self._connections[conn.endpoint]
        self._live.discard(conn)
        self._retiring.discard(conn)

    def endpoints(self) -> frozenset[str]:
        return frozenset(self._connections)

    def keep_only(self, endpoints: Collection[str], grace: float) -> None:
        keep = self._kept = set(endpoints)
        for endpoint in [e for e in self._connections if e not in keep]:
            self._retire(self._connections.pop(endpoint), grace)
        for endpoint in [e for e in self._connecting if e not in keep]:
            self._forgotten.add(self._connecting.pop(endpoint))  # retired once connected (_connected)
        self._forgotten_grace = grace

    def _retire(self, conn: ClientConnection, grace: float) -> None:
        """Calls under way finish within ``grace``; then the connection closes."""
        conn.go_away()  # closes it once its last call is answered
        if conn.closed or conn in self._retiring:
            return
        self._retiring.add(conn)

        async def bounded() -> None:
            lost = asyncio.shield(conn.lost)  # a cancelled close() leaves the connection's own future alone
            await asyncio.wait([lost], timeout=grace)
            conn.close(abort=True)  # what is still buffered is for calls that just failed
            await lost

        task = asyncio.get_running_loop().create_task(bounded())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def close(self, grace: float) -> None:
        self._closing = True
        self.keep_only((), grace)
        for conn in list(self._live):  # replaced ones too, still finishing their calls
            self._retire(conn, grace)
        await asyncio.gather(*self._forgotten, return_exceptions=True)
        await asyncio.gather(*self._closers, return_exceptions=True)
        self._deadlines.close()  # every call has ended


def _admitted(conn: ClientConnection, owner_uid: int | None) -> ClientConnection:
    """``conn`` if a hook file owned by ``owner_uid`` may call it: judged by its
    socket as it was when dialled and the server found on it (what it is
    connected to, whatever is at the path now), for another file on the same
    endpoint or one whose owner a reload changed. ``Untrusted`` otherwise."""
    if owner_uid not in conn.trusted_for:
        if conn.socket is None or conn.peer is None:  # not judged when dialled (_connect sets both): not trusted
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {conn.endpoint}: its server was not checked")
        require_connected(conn.socket, conn.peer, owner_uid, conn.endpoint)
        conn.trusted_for.add(owner_uid)
    return conn


def _peer(transport: asyncio.BaseTransport) -> Peer | None:
    """Who serves a new connection (``SO_PEERCRED``); None if that cannot be read."""
    sock = transport.get_extra_info("socket")
    try:
        return None if sock is None else peer_of(sock)
    except OSError:
        return None
