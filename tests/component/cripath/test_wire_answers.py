"""What a client reads on the wire for an error: a trailers-only answer, as
the runtime sent it (one HEADERS frame that ends the stream, the same header
list), read by a hand-driven HTTP/2 client straight from the runtime and
through the proxy. On both data paths (tests/component/grpcpath/)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from ..rawh2 import ACK, END_HEADERS, END_STREAM, HEADERS, SETTINGS, RawPeer, frame, grpc_call

V1_STATUS = "/runtime.v1.RuntimeService/ContainerStatus"


async def _answer(socket: Path) -> list[tuple[int, int, list[tuple[str, str]]]]:
    """The frames of stream 1's answer (type, flags, decoded headers) up to the one that ends it."""
    peer = await RawPeer.connect(socket)
    try:
        peer.writer.write(frame(SETTINGS, 0, 0, b"") + frame(SETTINGS, ACK, 0, b"") + grpc_call(1, V1_STATUS))
        answer = []
        while (f := await peer.read()) is not None:
            kind, flags, stream, payload = f
            if stream != 1:
                continue
            headers = [(k, v) for k, v in peer.decoder.decode(payload)] if kind == HEADERS else []
            answer.append((kind, flags, headers))
            if flags & END_STREAM:
                return answer
        raise AssertionError(f"the connection closed before the answer ended: {answer}")
    finally:
        await peer.close()


@pytest.mark.parametrize(
    ("code", "details"),
    [(grpc.StatusCode.NOT_FOUND, "container \"abc\" not found"), (grpc.StatusCode.UNKNOWN, "päth: ünïcode %")],
)
async def test_an_error_answer_is_trailers_only_as_the_runtime_sent_it(fake, start_proxy, code, details) -> None:
    fake.script(V1_STATUS, code=code, details=details)
    await start_proxy(fake.socket)
    direct = await _answer(fake.socket)
    proxied = await _answer(fake.socket.parent / "proxy.sock")
    assert [(kind, flags & (END_STREAM | END_HEADERS)) for kind, flags, _ in direct] == [
        (HEADERS, END_STREAM | END_HEADERS)
    ]
    assert proxied == direct
    assert ("grpc-status", str(code.value[0])) in proxied[0][2]
