"""A no-op hook server on raw HTTP/2 frames: the benchmark's stand-in for a cheap hook server.

    python -m bench.leanhook SOCKET

It is the SDK's frames transport (``hooks.frameserver``) with the SDK taken
out: every hook method is answered with an empty response as soon as its
request has come, in the same read, with no task, no protobuf decode and no
handler. That costs less CPU per call than a hook server written with the
SDK, as a hook server in a compiled language (Koordinator's koordlet, in Go)
does; a hooked lifecycle measured with both tells the proxy's cost from its
hook server's. Any method but the seven hook methods answers UNIMPLEMENTED.
The HTTP/2 and its checks are the transport's, flow control included,
but for one: an answer that fits the peer's windows ends its stream within
the read that completed its request, so a second block (trailers) of that
stream later in the same read is dropped as a closed stream's late frame,
where the SDK's server, answering after the read, resets the stream
(RST_STREAM PROTOCOL_ERROR: trailers after the request's END_STREAM).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from hooks.frameserver import Call, Limits, Route
from hooks.frameserver.connection import Connection
from runtimeproxy import eventloop
from runtimeproxy.hookpath.points import HOOK_POINTS
from runtimeproxy.host import unixsocket

__all__ = ["HOOK_PATHS", "serve", "start"]

HOOK_PATHS = frozenset(point.full_method.encode() for point in HOOK_POINTS.values())
# It never decodes a message, so any size will do; 64 MiB keeps a runaway peer bounded.
_LIMITS = Limits(max_receive=64 << 20, max_send=64 << 20)


async def _never(request: bytes) -> bytes:  # a route is only looked up, never run (see _AnswerAtOnce)
    raise AssertionError("not called")


_ROUTES: dict[bytes, Route] = {path: _never for path in HOOK_PATHS}


class _AnswerAtOnce(Connection):
    def _dispatch(self, call: Call, request: bytes) -> None:
        self._reply(call, b"")  # every hook response with no field set


def _connection() -> Connection:
    return _AnswerAtOnce(_ROUTES, _LIMITS, lambda conn: None)


async def start(socket_path: Path) -> asyncio.AbstractServer:
    """Listen on ``socket_path`` (a stale socket file is replaced, a live one refused)."""
    unixsocket.prepare(socket_path)
    return await asyncio.get_running_loop().create_unix_server(_connection, str(socket_path))


async def serve(socket_path: Path) -> None:
    """Serve until SIGTERM, SIGINT or SIGHUP; "ready" is printed once listening."""
    server = await start(socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    identity = unixsocket.SocketIdentity.of(socket_path)
    print("ready", flush=True)
    async with server:
        await stop.wait()
    unixsocket.remove_own(socket_path, identity)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.leanhook", description=__doc__.split("\n")[0])
    parser.add_argument("socket", type=Path, help="unix socket path to listen on")
    args = parser.parse_args(argv)
    try:
        eventloop.run(serve(args.socket.absolute()), "auto")
    except unixsocket.UnixSocketError as exc:
        print(f"leanhook: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
