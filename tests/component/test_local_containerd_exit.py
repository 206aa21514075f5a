"""`serve --local-containerd`: the private containerd's exit ends serve at
once, in order (the proxy stops, then what containerd left is cleaned up), with
an error naming how it ended and its log's last lines, and exit status 1. Here
the containerd is a stand-in process (tests/integration/test_cli_local.py kills
a real one)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from .test_process import wait_for_line

REPO = Path(__file__).resolve().parents[2]

# serve, its LocalContainerd a stand-in: `sleep` as containerd, a log of its own.
STAND_IN = """
import asyncio, logging, sys
from pathlib import Path
from runtimeproxy.cli import main
from runtimeproxy.host import containerd
from runtimeproxy.host.process import tail

log = logging.getLogger("stand-in")

class StandIn:
    def __init__(self, base, die_with_parent=False):
        self.base = Path(base)
        self.socket = self.base / "containerd.sock"
        self.log_path = self.base / "containerd.log"

    async def __aenter__(self):
        self.base.mkdir(parents=True)
        self.log_path.write_text("level=info msg=starting\\nlevel=fatal msg=\\"the stand-in's last words\\"\\n")
        self.proc = await asyncio.create_subprocess_exec("sleep", "3600")
        (self.base / "pid").write_text(str(self.proc.pid))
        return self

    @property
    def pid(self):
        return self.proc.pid if self.proc.returncode is None else None

    @property
    def started_pid(self):
        return self.proc.pid

    async def wait_exit(self):
        return await self.proc.wait()

    def log_tail(self):
        return tail(self.log_path)

    async def __aexit__(self, *exc):
        log.info("containerd stopped", extra={"listen_left": Path(sys.argv[3]).exists()})

containerd.LocalContainerd = StandIn
sys.argv = ["runtime-proxy", "serve", *sys.argv[1:]]
main()
"""


async def test_the_private_containerd_s_exit_ends_serve_in_order_naming_its_signal_and_log(sock_dir: Path) -> None:
    """Before: the proxy served on, logging `backend unavailable` for ever."""
    listen, base = sock_dir / "proxy.sock", sock_dir / "local"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STAND_IN, "--listen", str(listen), "--local-containerd", str(base),
        "--hook-dir", str(sock_dir / "hooks"), "--log-format", "json", cwd=REPO, stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stderr is not None
        await wait_for_line(process.stderr, '"msg": "listening"')
        containerd = int((base / "pid").read_text())
        os.kill(containerd, signal.SIGKILL)
        rest = (await asyncio.wait_for(process.stderr.read(), 30)).decode()
        assert await asyncio.wait_for(process.wait(), 30) == 1
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    lines = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    exited = messages.index("shutting down: the private containerd exited")
    assert messages.index("stopped") > exited  # the proxy stopped serving...
    assert messages.index("containerd stopped") > messages.index("stopped")  # ...before containerd's stop
    assert lines[messages.index("containerd stopped")]["listen_left"] is False
    assert lines[exited]["status"] == "killed by SIGKILL" and lines[exited]["pid"] == containerd
    (fatal,) = [line for line in lines if line["msg"] == "fatal"]
    assert fatal["error"].startswith(f"the private containerd (pid {containerd}) exited: killed by SIGKILL; "
                                     "it is not restarted")
    assert fatal["error"].endswith('level=fatal msg="the stand-in\'s last words")')
    assert "Traceback" not in rest
    assert not listen.exists()
