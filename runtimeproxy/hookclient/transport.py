"""What the dispatcher needs of a way to call hook servers."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import grpc

if TYPE_CHECKING:
    from .endpointtrust import Peer, SocketSeen

MAX_MESSAGE_BYTES = 16 << 20  # a hook answer may be as large as the CRI request it changes (kubelet sends up to 16 MiB)


class CallFailed(Exception):
    """A hook call that ended without an answer, with the status grpc would report."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class NoMessage(CallFailed):
    """The server answered OK but with no message, or more than one: its
    handler's fault, not the connection's, so counted ``invalid_answer``
    (grpc.aio hands back None for no message; more than one waits out the
    deadline there, see grpcaio.py)."""

    def __init__(self, details: str = "hook server answered OK with no message") -> None:
        super().__init__(grpc.StatusCode.INTERNAL, details)


class Untrusted(Exception):
    """The endpoint's socket may not be called (endpointtrust.py): no call
    was made. Not a ``CallFailed``: counted ``untrusted_endpoint``. ``seen``
    is the socket as judged, for the hook file owner ``reason`` names, and
    ``peer`` the server found listening there if it was refused once
    connected (``remembered``: as found at an earlier connect to the same
    socket, not dialled now): a call for another owner waiting on the same
    dial judges both again (pool.py)."""

    def __init__(self, reason: str, seen: SocketSeen, peer: Peer | None = None, remembered: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.seen, self.peer, self.remembered = reason, seen, peer, remembered


@runtime_checkable  # a stand-in's (hooks.chaincheck) test checks it has every method
class HookTransport(Protocol):
    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        """One unary call to the unix socket ``endpoint``: the answer's bytes,
        or ``CallFailed`` (``NoMessage`` for an OK status without one message).
        Connecting is part of the call, bounded by ``timeout``. ``Untrusted``
        if the socket may not be called for a hook file owned by ``owner_uid``
        (None: a file whose owner is unknown, judged as root's), judged at
        least whenever a connection is dialled. Required, so that no caller
        forgets the file's owner and is judged as root's."""

    def keep_only(self, endpoints: Collection[str], grace: float) -> None:
        """Close the connections to every other endpoint; calls under way on them get ``grace`` seconds."""

    def endpoints(self) -> frozenset[str]:
        """The endpoints it holds a connection (or channel) to."""

    async def close(self, grace: float) -> None:
        """Close everything; calls under way get ``grace`` seconds, then fail as CANCELLED."""


def transport_for(kind: str) -> HookTransport:
    """The transport of a data path: ``frames`` (the proxy's own HTTP/2) or ``grpc`` (grpc.aio)."""
    if kind == "frames":
        from .pool import FramesTransport

        return FramesTransport()
    if kind == "grpc":
        from .grpcaio import GrpcTransport

        return GrpcTransport()
    raise ValueError(f"unknown hook transport {kind!r} (frames or grpc)")
