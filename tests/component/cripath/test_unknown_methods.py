"""Methods the proxy does not know (a newer kubelet's) are relayed as byte
streams: the runtime's status must reach the client whatever the timing."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.host.unixsocket import grpc_address

from ..fakes import version_response

NO_SUCH = "/runtime.v1.RuntimeService/NoSuchMethod"
CALLS = 300  # the lost status showed in a few to a few dozen calls of 300


class ContainerdLike(grpc.GenericRpcHandler):
    """Answers Version; any other method either OK at once or, as containerd
    does for a method it does not have, UNIMPLEMENTED before reading a byte."""

    def __init__(self, knows_everything: bool) -> None:
        self.knows_everything = knows_everything

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method.endswith("/Version"):
            async def version(request: bytes, context: aio.ServicerContext) -> bytes:
                return version_response("v1")

            return grpc.unary_unary_rpc_method_handler(version)
        if not self.knows_everything:
            return None  # grpc answers UNIMPLEMENTED from its core, at once

        async def ok(request: bytes, context: aio.ServicerContext) -> bytes:
            return b"done:" + request

        return grpc.unary_unary_rpc_method_handler(ok)


EXPECTED = {"ok": ("OK", "done:x"), "unimplemented": ("UNIMPLEMENTED", "Method not found!")}


@pytest.fixture(params=sorted(EXPECTED))
async def backend(request: pytest.FixtureRequest, sock_dir: Path) -> AsyncIterator[tuple[Path, tuple[str, str]]]:
    server = aio.server()
    server.add_generic_rpc_handlers((ContainerdLike(request.param == "ok"),))
    socket = sock_dir / "backend.sock"
    server.add_insecure_port(grpc_address(socket))
    await server.start()
    yield socket, EXPECTED[request.param]
    await server.stop(0)


async def test_unary_client_gets_the_runtimes_status_every_time(backend, start_proxy, client) -> None:
    socket, expected = backend
    await start_proxy(socket)
    outcomes: Counter[tuple[str, str]] = Counter()
    for _ in range(CALLS):
        try:
            reply = await client.unary_unary(NO_SUCH)(b"x", timeout=10)
            outcomes["OK", reply.decode()] += 1
        except aio.AioRpcError as err:
            outcomes[err.code().name, err.details() or ""] += 1
    assert outcomes == {expected: CALLS}


# The synchronous client, on purpose: grpc.aio's own streaming client can
# lose a status it already received (grpc/grpc#36066); this one reports what
# the proxy sent, as kubelet's Go client does. In a process of its own: the
# synchronous and asyncio grpc stacks are not mixed in one process.
STREAMING_CLIENT = """
import json, sys
from collections import Counter
import grpc

target, method, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
outcomes = Counter()
with grpc.insecure_channel(target) as channel:
    call = channel.stream_stream(method)
    for _ in range(calls):
        try:
            replies = list(call(iter([b"x"]), timeout=10))
            outcomes["OK|" + b"|".join(replies).decode()] += 1
        except grpc.RpcError as err:
            outcomes[err.code().name + "|" + (err.details() or "")] += 1
print(json.dumps(outcomes))
"""


async def test_streaming_client_gets_the_runtimes_status_every_time(backend, start_proxy, sock_dir) -> None:
    socket, expected = backend
    await start_proxy(socket)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STREAMING_CLIENT, f"unix://{sock_dir / 'proxy.sock'}", NO_SUCH, str(CALLS),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0
    outcomes = {tuple(key.split("|", 1)): count for key, count in json.loads(out).items()}
    assert outcomes == {expected: CALLS}
