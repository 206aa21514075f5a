"""The socket rules for real, in a child process: Proxy.start and
HookServer.start against a socket whose owner they cannot reach.

* EACCES: a root-owned 0600 socket someone listens on, probed by a process
  without privileges (root never gets EACCES). The directory is writable by
  all, so a start that took the socket for stale could unlink it.
* A full backlog: a live listener that never accepts. A probe without a
  bound would block for ever: the child is killed after CHILD_TIMEOUT, and
  the test fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy.host.unixsocket import PROBE_TIMEOUT, SocketIdentity
from tests.unixsockets import full_backlog

PROJECT_ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534
CHILD_TIMEOUT = 20.0

CHILD = r"""
import asyncio, json, os, sys, time
from pathlib import Path
from hooks.sdk import HookServer
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy

which, path, uid = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])

async def main():
    if which == "proxy":
        server = Proxy(ProxyConfig(listen=path, backend=path.with_name("backend.sock")))
    else:
        server = HookServer(path)
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    started = time.monotonic()
    try:
        await server.start()
    except Exception as exc:
        return {"refused": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - started}
    await server.stop(0)
    return {"started": True}

print(json.dumps(asyncio.run(main())), flush=True)
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A short directory anyone may write to (as /run/... is for its owner)."""
    d = Path(tempfile.mkdtemp(prefix="usc-", dir="/tmp"))
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def start_in_child(which: str, path: Path, uid: int = -1) -> dict:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, which, str(path), str(uid),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=PROJECT_ROOT,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CHILD_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"{which} start did not return within {CHILD_TIMEOUT}s (a probe without a bound?)")
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@pytest.mark.parametrize(("which", "error"), [("proxy", "ListenError"), ("sdk", "HookServerError")])
async def test_eacces_is_refused_and_the_socket_kept(open_dir: Path, which: str, error: str) -> None:
    path = open_dir / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(8)
        identity = SocketIdentity.of(path)

        outcome = await start_in_child(which, path, NOBODY)

        assert outcome.get("refused") == error, outcome
        assert f"cannot tell whether {path} is in use" in outcome["message"]
        assert "EACCES" in outcome["message"]
        assert SocketIdentity.of(path) == identity
        # Its owner still serves on it.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))


@pytest.mark.parametrize(("which", "error"), [("proxy", "ListenError"), ("sdk", "HookServerError")])
async def test_full_backlog_is_refused_within_the_timeout(open_dir: Path, which: str, error: str) -> None:
    path = open_dir / "busy.sock"
    with full_backlog(path) as listener:
        identity = SocketIdentity.of(path)

        outcome = await start_in_child(which, path)

        assert outcome.get("refused") == error, outcome
        assert str(path) in outcome["message"] and "EAGAIN" in outcome["message"]
        assert outcome["elapsed"] < PROBE_TIMEOUT + 0.5
        assert SocketIdentity.of(path) == identity
        listener.setblocking(False)
        conn, _ = listener.accept()  # its queued client is still there
        conn.close()
