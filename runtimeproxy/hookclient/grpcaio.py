"""Hook calls on grpc.aio channels (the grpc data path's transport).

One malformed answer fails here unlike on the frames transport: an OK answer
with two messages. grpc core's HTTP/2 transport hands a client its status
only once every message received has been read (chttp2's
maybe_complete_recv_trailing_metadata waits for its frame_storage to drain),
and a unary call reads one: the second is never read, the status never
comes, and the call ends at its deadline, ``deadline_exceeded``, where
frames says ``invalid_answer`` at once. Telling it apart here would take a
unary-stream call, a read for the message and another for the end on every
call: the hooked path's cost, for a broken server that fails either way.
(tests/unit/hookclient/test_malformed_answers.py guards it.)

The socket is judged at every call (endpointtrust.py), but not the server
that answers on it: grpc.aio hands us no socket of the connections it makes,
so its peer's credentials (``SO_PEERCRED``) cannot be read. A socket swapped
in at the path between a call's look and grpc's connect is not caught here,
as it is on the frames transport (pool.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import grpc
from grpc import aio

from .endpointtrust import look, require_trusted
from ..hookpath.hookfile import MAX_TIMEOUT
from ..host.unixsocket import grpc_target
from .transport import MAX_MESSAGE_BYTES, CallFailed, NoMessage

CHANNEL_OPTIONS = [
    # A hook server that restarts is reachable again within a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # grpc also uses this as the deadline of one connection attempt, the
    # HTTP/2 handshake included. Connecting is part of the hook call, which
    # its own timeout bounds: never fail a slow-starting server earlier.
    ("grpc.min_reconnect_backoff_ms", int(MAX_TIMEOUT * 1000)),
    # grpc's 4 MiB default would fail a large answer.
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


class GrpcTransport:
    """One grpc.aio channel per endpoint, opened at its first call."""

    def __init__(self) -> None:
        self._channels: dict[str, aio.Channel] = {}
        self._methods: dict[tuple[str, str], aio.UnaryUnaryMultiCallable] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def _method(self, endpoint: str, method: str) -> aio.UnaryUnaryMultiCallable:
        callable_ = self._methods.get((endpoint, method))
        if callable_ is None:
            channel = self._channels.get(endpoint)
            if channel is None:
                channel = self._channels[endpoint] = aio.insecure_channel(grpc_target(endpoint), options=CHANNEL_OPTIONS)
            # Bytes in and out: the dispatcher encodes and decodes (grpc's own
            # decoding failure logs an ERROR with a traceback on top of ours).
            callable_ = self._methods[endpoint, method] = channel.unary_unary(method)
        return callable_

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        # At every call: grpc dials (and dials again) behind our back, so the
        # socket may have been replaced under any call's connection.
        require_trusted(look(endpoint), owner_uid)
        try:
            # The grpc deadline bounds a hang; asyncio.timeout is the backstop
            # should the deadline itself not fire.
            async with asyncio.timeout(timeout + 1.0):
                answer = await self._method(endpoint, method)(request, timeout=timeout)
        except aio.AioRpcError as err:
            raise CallFailed(err.code(), err.details() or "") from err
        except TimeoutError as err:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from err
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller is being cancelled: not the hook's failure
            raise CallFailed(grpc.StatusCode.CANCELLED, "hook call cancelled (its channel was closed)") from None
        if answer is None:  # grpc.aio's word for an OK status that carried no message
            raise NoMessage()
        return answer

    def endpoints(self) -> frozenset[str]:
        return frozenset(self._channels)

    def keep_only(self, endpoints: Collection[str], grace: float) -> None:
        for endpoint in set(self._channels) - set(endpoints):
            channel = self._channels.pop(endpoint)
            self._methods = {key: m for key, m in self._methods.items() if key[0] != endpoint}
            task = asyncio.get_running_loop().create_task(channel.close(grace=grace))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self, grace: float) -> None:
        channels, self._channels, self._methods = list(self._channels.values()), {}, {}
        for channel in channels:
            await channel.close(grace=grace)
        await asyncio.gather(*self._closing, return_exceptions=True)
