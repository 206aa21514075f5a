"""Socket activation: serve on the listening socket systemd holds for us.

With ``runtime-proxy.socket``, systemd binds the proxy socket and passes it
as fd 3 (``LISTEN_FDS``/``LISTEN_PID``, see sd_listen_fds(3)). It keeps its
own copy across proxy restarts, so kubelet's connection attempts meanwhile
wait in the backlog instead of failing on a missing socket.

The frames data path serves the inherited socket itself (frames/listener.py).
On the grpc path, grpc cannot serve on a socket it did not bind: the Python API takes only
addresses, and grpc core's own systemd support (adopting a pre-bound fd of
the same path) is compiled in only with libsystemd, which the grpcio wheels
lack. So the proxy accepts on the inherited socket itself and relays each
connection to grpc listening on a private socket in a 0700
directory next to the public one (never an abstract socket: those have no
permissions, and would let any local user around the public socket's 0660).
The relay is one asyncio protocol pair per connection with flow control; it
passes bytes as they come, and in front of grpc reads frame headers, nothing
else, to hand calls that cross the shutdown over to the next instance
(handover.py).

Connections are accepted only once the backend answered its first probe
(bounded by ``ACCEPT_HOLD_S``): until then they wait in the backlog rather
than be refused UNAVAILABLE; and at shutdown accepting stops first, so that
kubelet's reconnects wait for the next instance.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from ..host import unixsocket
from ..host.acceptor import Acceptor
from ..frames.frame import ErrorCode, rst_stream, window_update
from .handover import ClientStreams, ServerFrames

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3
ACCEPT_HOLD_S = 2.0
CLOSE_WAIT_S = 1.0  # shutdown: how long relayed connections may take to end once grpc stopped
_ENV = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(RuntimeError):
    pass


def inherited_socket(environ: MutableMapping[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed to this process, or None.

    Like sd_listen_fds(unset_environment=1): the variables are removed, so
    that a child (the private containerd of --local-containerd) never takes
    them for its own; the fd is made close-on-exec for the same reason."""
    env = os.environ if environ is None else environ
    pid, fds = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    for name in _ENV:
        env.pop(name, None)
    if not pid or not fds:
        return None
    if pid != str(os.getpid()):
        log.info("LISTEN_FDS is meant for another process; binding our own socket", extra={"listen_pid": pid})
        return None
    try:
        count = int(fds)
    except ValueError:
        raise ActivationError(f"LISTEN_FDS={fds!r} is not a number") from None
    if count < 1:
        return None
    if count > 1:
        log.warning("systemd passed several sockets; serving on the first", extra={"listen_fds": count})
    fd = SD_LISTEN_FDS_START
    try:
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
    except OSError as exc:  # closed, or a file: not what systemd passes
        raise ActivationError(f"fd {fd} from systemd is not a socket: {exc.strerror or exc}") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ActivationError(f"fd {fd} from systemd is not a unix stream socket (ListenStream= a path)")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ActivationError(f"fd {fd} from systemd is not listening")
    address = sock.getsockname()
    if not isinstance(address, str) or not address.startswith("/"):  # abstract (bytes) or unnamed ("")
        sock.detach()
        raise ActivationError(
            f"fd {fd} from systemd is not bound to a path ({address!r}); ListenStream= an absolute path")
    sock.setblocking(False)
    return sock


def private_socket_path(public: Path) -> Path:
    """Where grpc listens behind the relay: in a directory only root can enter."""
    directory = public.parent / f".{public.name}.private"
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)  # an existing one too
    return directory / f"{os.getpid()}.sock"


def clean_private_dir(public: Path) -> None:
    """Remove sockets that crashed instances left behind (live ones are kept)."""
    directory = public.parent / f".{public.name}.private"
    for stale in directory.glob("*.sock"):
        try:
            unixsocket.prepare(stale)
        except unixsocket.UnixSocketError:
            pass  # in use: another instance's


@dataclass
class Traffic:
    """What the relayed connections did lately, for a shutdown's quiet period
    (Proxy._stop_accepting): a connection grpc has not spoken on yet is never
    quiet, since its client's first calls are still to come."""

    reads: int = 0
    unanswered: int = 0  # accepted connections that have not had grpc's first bytes

    def mark(self) -> int | None:
        """Changes with every read; None while a connection waits for grpc."""
        return None if self.unanswered else self.reads


class _Half(asyncio.Protocol):
    """One side of a relayed connection; writes what it reads to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.ended = False  # this side sent its EOF

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream's: a Transport (Protocol says BaseTransport)

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None and self.peer.transport is not None
        self.peer.transport.write(data)

    def eof_received(self) -> bool:
        self.ended = True
        peer = self.peer
        if peer is None or peer.transport is None:
            return True
        if peer.ended:  # both ways are done: the connection is over, and its two sockets are closed
            peer.transport.close()
            return False  # asyncio closes this side
        if peer.transport.can_write_eof():
            peer.transport.write_eof()
        return True  # half-close: the other direction may still carry data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # Flow control: a slow reader on one side slows the writer on the other.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Upstream(_Half):
    """The side towards grpc: its first bytes answer the client's connection."""

    def __init__(self, client: _Client) -> None:
        super().__init__()
        self.peer = client  # grpc speaks first (its SETTINGS), maybe before we link back
        self._client = client

    def data_received(self, data: bytes) -> None:
        self._client.read()
        frames = self._client.server_frames
        if frames is not None:
            data = frames.feed(data)
        super().data_received(data)

    def eof_received(self) -> bool:
        self._client.flush_refusals()
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.flush_refusals()
        super().connection_lost(exc)


class ActivatedListener:
    """Accepts on the inherited socket and relays each connection to ``upstream``."""

    def __init__(self, sock: socket.socket, upstream: Path, hand_over: bool = True) -> None:
        """``hand_over``: ``upstream`` is grpc's server, whose calls crossing
        the shutdown are refused for a retry (``refuse_new_streams``)."""
        self.traffic = Traffic()
        self.hand_over = hand_over
        self.cut = False
        self._clients: set[_Client] = set()  # open client connections, linked to grpc or not yet
        self._all_closed: asyncio.Future[None] | None = None  # close() waits for the last of them
        self._acceptor = Acceptor(sock, self._accepted)
        self._upstream = upstream
        self._stopped = False
        self._accepting = False
        self._pending: set[asyncio.Task[None]] = set()  # accepted connections being linked to grpc
        self.address = sock.getsockname()

    async def start_accepting(self) -> None:
        if self._stopped:  # stopped before the backend was ever probed
            return
        self._acceptor.start()
        self._accepting = True
        log.info("accepting on the socket from systemd", extra={"socket": self.address})

    def _accepted(self, conn: socket.socket) -> None:
        task = asyncio.get_running_loop().create_task(self._connect_accepted(conn), name="activation-relay-accept")
        self._pending.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._pending.discard(task)
            if task.cancelled():  # maybe before its first step: the socket is still ours to close
                conn.close()

        task.add_done_callback(done)

    async def _connect_accepted(self, conn: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: _Client(self), sock=conn)
        except OSError:  # the client is gone already
            conn.close()

    def _link(self, client: _Client) -> None:
        task = asyncio.get_running_loop().create_task(self._connect(client), name="activation-relay-connect")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _connect(self, client: _Client) -> None:
        loop = asyncio.get_running_loop()
        upstream = _Upstream(client)
        try:
            await loop.create_unix_connection(lambda: upstream, str(self._upstream))
        except OSError as exc:
            log.warning("cannot relay a connection to the proxy's grpc server", extra={"error": str(exc)})
            if client.transport is not None:
                client.transport.close()
            return
        client.link(upstream)
        assert upstream.transport is not None
        if client.transport is None or client.transport.is_closing():
            upstream.transport.close()
            return
        try:
            client.transport.resume_reading()
        except RuntimeError:  # uvloop: closed under us (close() cancelled its accept), not yet "closing"
            upstream.transport.close()

    def refuse_new_streams(self) -> None:
        """grpc shuts down now: streams clients open from here on are refused (handover.py)."""
        self.cut = True
        for client in self._clients:
            if client.streams is not None:
                client.streams.cut()

    def stop_accepting(self) -> None:
        """New connections wait in the backlog (for the next instance)."""
        self._stopped = True
        self._acceptor.close()  # closes our copy of the fd; systemd keeps its own
        if self._accepting:
            self._accepting = False
            log.info("stopped accepting; new connections wait in the backlog", extra={"socket": self.address})

    async def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """After grpc stopped: each connection ends once grpc has closed its
        side and the relay has passed on all grpc said (the answers of the
        last calls may still be on their way), at most ``wait`` seconds;
        what is left then is closed."""
        while self._pending:  # a cancelled accept can still start its link to grpc
            for task in list(self._pending):
                task.cancel()
            await asyncio.wait(list(self._pending))
        # A connection never linked to grpc has nothing of grpc's to pass on.
        for client in [c for c in self._clients if c.peer is None and c.transport is not None]:
            client.transport.close()  # type: ignore[union-attr]  # not None: the list's condition
        loop = asyncio.get_running_loop()
        began = loop.time()
        if self._clients:
            self._all_closed = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._all_closed), wait)
            except TimeoutError:
                pass
        left = [half for half in self._clients if half.transport is not None]
        for half in left:
            half.transport.close()  # type: ignore[union-attr]  # not None: the list's condition
        self._clients.clear()
        log.info("relayed connections closed", extra={"waited_s": round(loop.time() - began, 3),
                                                       "closed_by_proxy": len(left)})

    def _closed(self, client: _Client) -> None:
        self._clients.discard(client)
        if not self._clients and self._all_closed is not None and not self._all_closed.done():
            self._all_closed.set_result(None)


class _Client(_Half):
    """The accepted side: reads nothing until its upstream connection is made."""

    def __init__(self, listener: ActivatedListener) -> None:
        super().__init__()
        self._listener = listener
        self._early: list[bytes] = []  # read before the upstream connection was made
        self._early_eof = False
        self._answered = False  # grpc has sent its first bytes
        self.streams: ClientStreams | None = None
        self.server_frames: ServerFrames | None = None
        if listener.hand_over:
            self.streams = ClientStreams(self._refuse)
            self.server_frames = ServerFrames()
            if listener.cut:
                self.streams.cut()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._listener._clients.add(self)
        self._listener.traffic.unanswered += 1
        # asyncio's loop honours this; uvloop starts reading after connection_made
        # whatever it asked for, so data_received keeps what comes before the link.
        transport.pause_reading()  # type: ignore[attr-defined]  # a stream's: a Transport (Protocol says BaseTransport)
        self._listener._link(self)

    def read(self, answer: bool = True) -> None:
        """Bytes went either way; ``answer``: grpc's, so it has spoken."""
        traffic = self._listener.traffic
        traffic.reads += 1
        if answer and not self._answered:
            self._answered = True
            traffic.unanswered -= 1

    def data_received(self, data: bytes) -> None:
        self.read(answer=False)
        if self.streams is not None:
            data = self.streams.feed(data)
            if self.streams.dropped:  # the window that DATA kept from grpc took, given back
                self._send_own(window_update(0, self.streams.dropped))
                self.streams.dropped = 0
        if self.peer is None:
            self._early.append(data)
            assert self.transport is not None
            self.transport.pause_reading()
            return
        super().data_received(data)

    def eof_received(self) -> bool:
        if self.peer is None:
            self.ended = self._early_eof = True
            return True
        return super().eof_received()

    def link(self, upstream: _Half) -> None:
        """Relay to ``upstream`` from now on, starting with what was read before."""
        self.peer = upstream
        assert upstream.transport is not None
        for data in self._early:
            upstream.transport.write(data)
        self._early.clear()
        if self._early_eof and upstream.transport.can_write_eof():
            upstream.transport.write_eof()

    def _refuse(self, stream: int) -> None:
        log.info("call crossing the shutdown refused; the client retries it on the next instance",
                 extra={"stream": stream})
        self._send_own(rst_stream(stream, ErrorCode.REFUSED_STREAM))

    def _send_own(self, frame: bytes) -> None:
        """A frame of the relay's to the client, between two of grpc's (handover.py)."""
        assert self.server_frames is not None
        self._write(self.server_frames.insert(frame))

    def flush_refusals(self) -> None:
        """grpc closed the connection: what the relay still holds goes out before the client's side closes."""
        if self.server_frames is not None:
            self._write(self.server_frames.end())

    def _write(self, data: bytes) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.read()  # a closed connection waits for nothing
        self._listener._closed(self)
