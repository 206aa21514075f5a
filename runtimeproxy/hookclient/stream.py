"""One hook call on a connection: what it may still send, and its answer as it arrives."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from ..frames.messages import BadMessages, inflate
from .headers import grpc_status
from .transport import CallFailed, NoMessage


class Unprocessed(CallFailed):
    """The server did not process the call (REFUSED_STREAM, or past a GOAWAY's
    last stream): sending it again, on another connection, is safe."""


@dataclass(eq=False)
class Stream:
    id: int
    window: int  # what we may still send on it (the server's credit)
    answer: asyncio.Future[bytes]
    max_message: int
    received: int = 0  # window the server has used up and we have not given back
    body: bytearray = field(default_factory=bytearray)
    headers: dict[bytes, bytes] | None = None  # the answer's first header block
    request_sent: bool = False  # our END_STREAM went (or nothing more will: a reset)

    def fail(self, error: CallFailed) -> None:
        if not self.answer.done():
            self.answer.set_exception(error)

    def take(self, chunk: bytes | memoryview) -> bool:
        """A DATA payload of the answer; False (and failed) once it is over the limit."""
        self.body += chunk
        if len(self.body) <= self.max_message + 5:
            return True
        self.fail(CallFailed(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"hook answer larger than the limit of {self.max_message} bytes"
        ))
        return False

    def finish(self, trailers: dict[bytes, bytes]) -> None:
        """The server ended the call: its status, or its one message."""
        code, message = grpc_status(trailers)
        body = self.body
        if code is not grpc.StatusCode.OK:
            self.fail(CallFailed(code, message))
        elif not body:
            self.fail(NoMessage())
        elif len(body) < 5 or body[0] not in (0, 1) or int.from_bytes(body[1:5], "big") != len(body) - 5:
            self.fail(NoMessage(f"hook server answered OK with {len(body)} bytes that are not one gRPC message"))
        elif body[0]:
            self._inflated(bytes(memoryview(body)[5:]))
        elif not self.answer.done():
            self.answer.set_result(bytes(memoryview(body)[5:]))

    def _inflated(self, message: bytes) -> None:
        """A compressed answer, though the call did not offer any encoding:
        inflated all the same (gzip, deflate), as the grpc transport does,
        which offers both. A grpc-go server with a compressor set for all its
        answers (grpc.RPCCompressor) sends them so whatever the client
        offered; an operator expects the hook to work on either transport.
        What grpc cannot inflate fails INTERNAL there too."""
        encoding = (self.headers or {}).get(b"grpc-encoding", b"identity")
        out = inflate(message, encoding, self.max_message, "hook answer")
        if isinstance(out, BadMessages):
            if out.code is grpc.StatusCode.RESOURCE_EXHAUSTED:  # (its text names the hook answer and the limit)
                self.fail(CallFailed(out.code, str(out)))
            else:
                self.fail(CallFailed(grpc.StatusCode.INTERNAL, f"hook answer is compressed, and cannot be read: {out}"))
        elif not self.answer.done():
            self.answer.set_result(out)
