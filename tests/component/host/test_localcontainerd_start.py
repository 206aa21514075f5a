"""LocalContainerd.start against fake containerds: one that serves but whose
CRI plugin never gets ready (the error says what start-up was waiting for,
since containerd's own log may end at "successfully booted"), and one that
loses its listener on the first start, as containerd 1.7.13 may while it
starts NRI plugins (started once more)."""

from __future__ import annotations

import logging
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


# Its first start says it booted with its socket file left and nobody listening
# (what containerd 1.7.13 shows when it closed its own listener); the next one serves.
LISTENER_LOST_ONCE = """\
import asyncio, socket, sys
from pathlib import Path
import grpc
from grpc import aio

class Answers(grpc.GenericRpcHandler):
    def service(self, details):
        async def answer(request, context):
            return b""
        return grpc.unary_unary_rpc_method_handler(answer)

async def main():
    base = Path(sys.argv[2]).parent
    starts = base / "starts"
    starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
    path = base / "containerd.sock"
    path.unlink(missing_ok=True)
    if len(starts.read_text()) == 1:
        lost = socket.socket(socket.AF_UNIX)
        lost.bind(str(path))
        lost.close()
        print("msg=\\"containerd successfully booted in 0.1s\\"", flush=True)
        await asyncio.Event().wait()
    server = aio.server()
    server.add_generic_rpc_handlers((Answers(),))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    print("msg=\\"containerd successfully booted in 0.1s\\"", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def _fake_containerd(tmp_path: Path, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "containerd"
    fake.write_text(f"#!{sys.executable}\n{script}")
    fake.chmod(0o755)
    return bin_dir


async def test_a_start_that_lost_its_listener_is_made_again_with_nri(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bin_dir = _fake_containerd(tmp_path, LISTENER_LOST_ONCE)
    runtime = LocalContainerd(tmp_path / "c", bin_dir=bin_dir, snapshotter="native", nri=True)
    with caplog.at_level(logging.WARNING, logger="runtimeproxy.host.containerd"):
        await runtime.start(timeout=10.0, images=False)
    try:
        assert (runtime.base / "starts").read_text() == "xx"
        assert runtime.pid is not None
        (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "lost a listening socket" in warning.getMessage() and "containerd/nri#66" in warning.getMessage()
        assert "refused connections" in warning.error
    finally:
        await runtime.stop()


async def test_without_nri_a_refusing_containerd_is_not_started_again(tmp_path: Path) -> None:
    bin_dir = _fake_containerd(tmp_path, LISTENER_LOST_ONCE)
    runtime = LocalContainerd(tmp_path / "c", bin_dir=bin_dir, snapshotter="native")
    with pytest.raises(LocalRuntimeError) as failure:
        await runtime.start(timeout=2.0, images=False)
    assert "waiting for CRI Version, last answered UNAVAILABLE" in str(failure.value)
    assert "Connection refused" in str(failure.value)
    assert (runtime.base / "starts").read_text() == "x"
