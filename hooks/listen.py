"""A :class:`hooks.sdk.HookServer`'s listener, on either transport, started on its socket path."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from hooks.errors import HookServerError
from hooks.frameserver import FrameServer
from hooks.routes import frame_routes, service_handlers
from hooks.sharedrun import to_end
from runtimeproxy.grpcstart import start_server
from runtimeproxy.hookpath.points import SERVICE_NAME
from runtimeproxy.host import unixsocket

if TYPE_CHECKING:
    from hooks.sdk import HookServer

__all__ = ["DEFAULT_OPTIONS", "MAX_MESSAGE_BYTES", "Listener", "close", "frames", "grpc_aio", "open_listener"]

Listener: TypeAlias = grpc.aio.Server | FrameServer

# A hook request is as large as the CRI call it comes from, and kubelet sends
# up to 16 MiB: grpc's default of 4 MiB would fail a Fail hook's pods.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# A HookServer's options before its caller's (which replace them by name).
DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)


async def open_listener(server: HookServer, transport: str, path: Path, options: Sequence[tuple[str, Any]],
                        mode: int) -> tuple[Listener, unixsocket.SocketIdentity]:
    """``server``'s listener on ``path`` (the caller holds its lock), its
    socket chmod-ed to ``mode``, and which file it bound: what is the
    server's to remove at its stop. A start that fails or is cut once bound
    undoes it all before it raises: each transport's start closes what it
    made itself; past it, the listener is stopped and our socket file
    removed, run to its end (``to_end``: a further stop's cancel, or a
    second signal's, must not cut it, leaving a listener or its socket)."""
    listener, identity = await (frames(server, path, options) if transport == "frames"
                                else grpc_aio(server, path, options))
    try:
        os.chmod(path, mode)
    except BaseException as exc:
        await to_end(close(listener, path, identity), f"undoing the start on {path}")
        if isinstance(exc, OSError):
            raise HookServerError(f"cannot set the mode of {path} to {mode:#o}: {exc.strerror or exc}") from exc
        raise
    return listener, identity


async def grpc_aio(server: HookServer, path: Path,
                   options: Sequence[tuple[str, Any]]) -> tuple[grpc.aio.Server, unixsocket.SocketIdentity]:
    listener = grpc.aio.server(options=options)
    listener.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, service_handlers(server)),))
    try:
        if listener.add_insecure_port(unixsocket.grpc_address(path)) == 0:  # older grpcio signal failure this way
            raise RuntimeError("bind failed")
    except RuntimeError as exc:
        raise HookServerError(f"cannot listen on {path}: {exc}") from exc
    # Bound now, not yet listening: read before any await, a socket another
    # process binds at the path later (ours gone) is not ours to remove.
    try:
        identity = unixsocket.SocketIdentity.of(path)
    except BaseException:  # (the socket gone already, say): the bound server stopped, as a failed start's is
        await to_end(listener.stop(None), "stopping a hook listener whose start failed")
        raise
    # A start cut short stops it: its listener must not outlive it (nor grpc's unlink at its end).
    try:
        await start_server(listener)
    except BaseException:
        # grpc unlinks its socket at the stop of a server that started only: one
        # whose start failed left it for the next start's stale check. Ours only.
        unixsocket.remove_own(path, identity)
        raise
    return listener, identity


async def frames(server: HookServer, path: Path,
                 options: Sequence[tuple[str, Any]]) -> tuple[FrameServer, unixsocket.SocketIdentity]:
    """The frames transport reads the two message limits of ``options``; the rest are grpc's."""
    settings = dict(options)
    listener = FrameServer(
        frame_routes(server),
        max_receive=_limit(settings.get("grpc.max_receive_message_length")),
        max_send=_limit(settings.get("grpc.max_send_message_length")),
    )
    try:
        identity = await listener.start(path)
    except OSError as exc:
        raise HookServerError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return listener, identity


def _limit(value: object) -> int:
    """A grpc message-length option as the frames transport takes it (-1, grpc's "no limit", is 2^31-1)."""
    size = int(value) if isinstance(value, int) else MAX_MESSAGE_BYTES
    return (1 << 31) - 1 if size < 0 else size


async def close(listener: Listener, path: Path, identity: unixsocket.SocketIdentity | None) -> None:
    """Undo a start that went no further than its listener (its socket's
    mode could not be set): the listener stopped at once and the socket file
    removed if it is still the one bound (grpc's stop unlinks it by name,
    the frames transport's leaves it to its owner)."""
    try:
        await listener.stop(None)
    finally:  # a stop that failed: the socket file, ours, removed all the same
        unixsocket.remove_own(path, identity)
