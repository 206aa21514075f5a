"""LocalContainerd.start against a containerd that serves but whose CRI
plugin never gets ready: the error says what start-up was waiting for,
since containerd's own log may end at "successfully booted"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runtimeproxy.host.containerd import LocalContainerd, LocalRuntimeError

# Stands in for `containerd --config DIR/containerd.toml`: serves gRPC on
# DIR/containerd.sock, and answers CRI Version as containerd's CRI plugin
# does before it is initialised.
NEVER_READY = """\
import asyncio, sys
from pathlib import Path
import grpc
from grpc import aio

class NotInitialised(grpc.GenericRpcHandler):
    def service(self, details):
        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNKNOWN, "server is not initialized yet")
        return grpc.unary_unary_rpc_method_handler(refuse)

async def main():
    socket = Path(sys.argv[2]).parent / "containerd.sock"
    server = aio.server()
    server.add_generic_rpc_handlers((NotInitialised(),))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
"""


async def test_start_names_the_call_it_waited_for(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "containerd"
    fake.write_text(f"#!{sys.executable}\n{NEVER_READY}")
    fake.chmod(0o755)
    runtime = LocalContainerd(tmp_path / "c", bin_dir=bin_dir, snapshotter="native")
    with pytest.raises(LocalRuntimeError) as failure:
        await runtime.start(timeout=3.0, images=False)
    assert "not ready within 3.0s (waiting for CRI Version, last answered UNKNOWN: server is not initialized yet)" in str(
        failure.value
    )
    assert runtime.pid is None  # stopped on the way out
