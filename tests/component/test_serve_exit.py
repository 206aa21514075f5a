"""`runtime-proxy serve` never keeps serving without a task it needs."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from .fakes import FakeBackend

# serve, with a hook-directory watcher that dies every time it is started.
BROKEN_WATCHER = """
import sys
from runtimeproxy.cli import main
from runtimeproxy.hookpath.registry import HookRegistry

async def broken(self, stop):
    raise RuntimeError("injected watcher fault")

HookRegistry.watch = broken
sys.argv = ["runtime-proxy", "serve", *sys.argv[1:]]
main()
"""


async def test_a_task_that_keeps_failing_ends_serve_with_a_non_zero_exit(fake: FakeBackend, sock_dir: Path) -> None:
    await serve_ends_when_a_task_keeps_failing(fake, sock_dir)


async def serve_ends_when_a_task_keeps_failing(fake: FakeBackend, sock_dir: Path, *options: str) -> None:
    """(``options``: more of serve's, e.g. the data path; the script is no ``-m runtimeproxy serve``
    that datapath.on_data_path would find.)"""
    listen = sock_dir / "proxy.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BROKEN_WATCHER,
        "--listen", str(listen), "--backend", str(fake.socket), "--hook-dir", str(sock_dir / "hooks"),
        "--log-format", "json", *options, stderr=asyncio.subprocess.PIPE,
    )
    try:
        # Five restarts with backoff (0.1 s doubling: about 3 s), then an orderly stop.
        _, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    log = err.decode()
    assert process.returncode == 1, log
    assert log.count('"msg": "restarting background task"') == 5
    assert '"msg": "background task keeps failing; the proxy cannot go on without it"' in log
    assert '"msg": "stopped"' in log
    assert not listen.exists()
    path = options[options.index("--data-path") + 1] if "--data-path" in options else "frames"
    assert f'"data_path": "{path}"' in log  # in its "listening" line
