"""A translated unary call with no request message, or two, on the frames
path: answered INTERNAL at once (as the hooked path and grpc-go answer it),
not left hanging as grpc.aio's server leaves it, nor passed on in part."""

from __future__ import annotations

import asyncio
import struct

import hpack
import pytest

from ..fakes import FakeBackend
from ..rawh2 import DATA, END_HEADERS, END_STREAM, HEADERS, RST_STREAM, frame, open_call, raw_with_settings

V1 = "/runtime.v1.RuntimeService/ListContainers"
A2 = "/runtime.v1alpha2.RuntimeService/ListContainers"


def message(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


CASES = {
    "no-message": lambda block: block[:3] + bytes([HEADERS, END_HEADERS | END_STREAM]) + block[5:],
    "two-messages": lambda block: block + frame(DATA, END_STREAM, 1, message(b"") + message(b"")),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_translated_unary_call_without_its_one_message_is_answered_internal(sock_dir, start_proxy, case) -> None:
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1alpha2"})) as fake:
        fake.script(A2, response=b"")
        await start_proxy(fake.socket, data_path="frames", serve_versions="v1,v1alpha2")
        peer = await raw_with_settings(sock_dir / "proxy.sock")
        peer.writer.write(CASES[case](open_call(1, V1)))
        decoder, status = hpack.Decoder(), None
        async with asyncio.timeout(10):
            while status is None:
                got = await peer.read()
                assert got is not None, "the proxy closed the connection"
                kind, flags, sid, payload = got
                assert not (kind == RST_STREAM and sid == 1)
                if kind == HEADERS and sid == 1:
                    status = dict(decoder.decode(payload)).get("grpc-status")
        assert status == "13"  # INTERNAL
        assert fake.calls(A2) == []
        await peer.close()
