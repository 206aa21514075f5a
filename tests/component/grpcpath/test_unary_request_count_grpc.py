"""A unary or server-streaming call whose request stream holds two messages,
or none, on the grpc data path (and a translated one on frames): answered
INTERNAL at once, as grpc-go (containerd) and grpc-java answer it, and not
passed on to the runtime (grpc.aio's handlers would pass the first message
on, or wait for a missing one until the deadline).
The frames path's own: tests/component/frames/test_diverted_unary.py."""

from __future__ import annotations

import pytest

from ..fakes import FakeBackend
from ..rawh2 import DATA, END_STREAM, final_status, frame, message, open_call, without_request

V1 = "/runtime.v1.RuntimeService/ListContainers"
A2 = "/runtime.v1alpha2.RuntimeService/ListContainers"


BODIES = {
    "no-message": without_request,
    "two-messages": lambda block: block + frame(DATA, END_STREAM, 1, message(b"") + message(b"")),
    "two-frames": lambda block: block + frame(DATA, 0, 1, message(b"")) + frame(DATA, END_STREAM, 1, message(b"")),
}


@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("backend_versions", [{"v1"}, {"v1alpha2"}], ids=["native", "translated"])
async def test_a_unary_call_without_its_one_message_is_answered_internal(
    sock_dir, start_proxy, body, backend_versions
) -> None:
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset(backend_versions)) as fake:
        await start_proxy(fake.socket, serve_versions="v1")
        assert await final_status(sock_dir / "proxy.sock", BODIES[body](open_call(1, V1))) == "13"  # INTERNAL
        assert fake.calls(V1) == fake.calls(A2) == []


async def test_a_unary_call_whose_end_of_stream_comes_apart_is_served(sock_dir, start_proxy) -> None:
    """One message, then END_STREAM in an empty DATA frame of its own: one request."""
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1"})) as fake:
        await start_proxy(fake.socket)
        call = open_call(1, V1) + frame(DATA, 0, 1, message(b"\x0a\x00")) + frame(DATA, END_STREAM, 1, b"")
        assert await final_status(sock_dir / "proxy.sock", call) == "0"
        assert [call.requests for call in fake.calls(V1)] == [[b"\x0a\x00"]]


EVENTS = "/runtime.v1.RuntimeService/GetContainerEvents"


@pytest.mark.parametrize("body", list(BODIES))
async def test_a_server_streaming_call_without_its_one_message_is_answered_internal(sock_dir, start_proxy, body) -> None:
    """As a unary call: grpc-go counts the request messages of any call whose client does not stream."""
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1"})) as fake:
        fake.script(EVENTS, stream=[b""])
        await start_proxy(fake.socket)
        assert await final_status(sock_dir / "proxy.sock", BODIES[body](open_call(1, EVENTS))) == "13"  # INTERNAL
        assert fake.calls(EVENTS) == []


async def test_a_server_streaming_call_with_its_one_message_is_served(sock_dir, start_proxy) -> None:
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1"})) as fake:
        fake.script(EVENTS, stream=[b""])
        await start_proxy(fake.socket)
        call = open_call(1, EVENTS) + frame(DATA, END_STREAM, 1, message(b""))
        assert await final_status(sock_dir / "proxy.sock", call) == "0"
        assert [call.requests for call in fake.calls(EVENTS)] == [[b""]]
