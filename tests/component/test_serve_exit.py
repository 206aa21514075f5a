"""`runtime-proxy serve` never keeps serving without a task it needs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocs import stderr_within

from ..unixsockets import stale_lock_holder
from .fakes import FakeBackend
from .test_process import wait_for_line

REPO = Path(__file__).resolve().parents[2]

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
    # Five restarts with backoff (0.1 s doubling: about 3 s), then an orderly stop.
    log = (await stderr_within(process, 60)).decode()
    assert process.returncode == 1, log
    assert log.count('"msg": "restarting background task"') == 5
    assert '"msg": "background task keeps failing; the proxy cannot go on without it"' in log
    assert '"msg": "stopped"' in log
    assert not listen.exists()
    path = options[options.index("--data-path") + 1] if "--data-path" in options else "frames"
    assert f'"data_path": "{path}"' in log  # in its "listening" line


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_a_stop_signal_while_waiting_for_the_sockets_lock_ends_serve_at_once(sock_dir: Path, data_path: str) -> None:
    # --listen's lock held by an instance that does not serve it: serve waits
    # (up to 30 s, more than the unit's TimeoutStopSec): a signal ends the wait.
    listen = sock_dir / "proxy.sock"
    async with stale_lock_holder(listen):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtimeproxy.cli", "serve", "--listen", str(listen),
            "--backend", str(sock_dir / "none.sock"), "--hook-dir", str(sock_dir / "hooks"),
            "--data-path", data_path, "--log-format", "json", cwd=REPO, stderr=asyncio.subprocess.PIPE)  # fmt: skip
        try:
            assert process.stderr is not None
            await wait_for_line(process.stderr, '"msg": "socket path held by another instance')
            process.send_signal(signal.SIGTERM)
        except BaseException:  # its line never came: no child outlives the test
            if process.returncode is None:
                process.kill()
            await process.wait()
            raise
        err = await stderr_within(process, 20)  # far less than the lock's wait
    assert process.returncode == 0, err.decode()
    assert '"msg": "signal received, shutting down"' in err.decode()


# What an operator got wrong, each with the one line serve logs for it: no traceback.
UNUSABLE = {
    "listen is a regular file": (["--listen", "{d}/file"], "{d}/file exists and is not a unix socket; refusing to replace it"),
    "listen below a regular file": (
        ["--listen", "{d}/file/p.sock"], "cannot create the directory of {d}/file/p.sock: {d}/file is not a directory"),
    "listen is a symlink to a socket": (["--listen", "{d}/link.sock"], "{d}/link.sock is a symbolic link, not a unix socket"),
    "--local-containerd is a regular file": (
        ["--local-containerd", "{d}/file"], "cannot use {d}/file as containerd's directory: File exists"),
    "LISTEN_FDS from systemd not a number": (["--listen-fds", "many"], "LISTEN_FDS='many' is not a number"),
    # The path is fine until the bind: sysfs refuses sockets, root or not.
    "listen where the kernel refuses a socket": (
        ["--listen", "/sys/runtime-proxy-test.sock"], "cannot listen on /sys/runtime-proxy-test.sock: Operation not permitted"),
    "the same on the grpc path": (
        ["--listen", "/sys/runtime-proxy-test.sock", "--data-path", "grpc"], "cannot listen on /sys/runtime-proxy-test.sock"),
}

# fd 3 as systemd would never pass it: set up by a wrapper that then execs serve.
FD3 = {
    "a regular file": "fd = os.open(sys.argv[1] + '/file', os.O_RDONLY)",
    "an abstract socket": (
        "s = socket.socket(socket.AF_UNIX); s.bind(b'\\0runtime-proxy-test-%d' % os.getpid()); s.listen(); fd = s.detach()"),
}
_WRAPPER = """
import os, socket, sys
{make}
os.dup2(fd, 3)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.executable, [sys.executable, "-m", "runtimeproxy.cli", "serve", "--listen", sys.argv[1] + "/p.sock",
         "--backend", sys.argv[1] + "/none.sock", "--hook-dir", sys.argv[1] + "/hooks", "--log-format", "json"])
"""


@pytest.mark.parametrize("case", FD3, ids=list(FD3))
def test_a_socket_from_systemd_that_cannot_be_served_ends_serve_in_one_line(sock_dir: Path, case: str) -> None:
    (sock_dir / "file").write_text("precious")
    served = subprocess.run([sys.executable, "-c", _WRAPPER.format(make=FD3[case]), str(sock_dir)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert served.returncode == 1, served.stderr
    assert "Traceback" not in served.stderr
    (fatal,) = [line for line in map(json.loads, served.stderr.splitlines()) if line["msg"] == "fatal"]
    assert fatal["error"].startswith("fd 3 from systemd is not")


@pytest.mark.parametrize("case", UNUSABLE, ids=list(UNUSABLE))
def test_what_the_operator_must_fix_ends_serve_in_one_line(sock_dir: Path, case: str) -> None:
    args, expected = ([a.format(d=sock_dir) for a in UNUSABLE[case][0]], UNUSABLE[case][1].format(d=sock_dir))
    (sock_dir / "file").write_text("precious")
    (sock_dir / "link.sock").symlink_to(sock_dir / "elsewhere.sock")
    env = dict(os.environ)
    if args[0] == "--listen-fds":  # for this process: LISTEN_PID is the pid sh execs python with
        env["LISTEN_FDS"] = args.pop(1)
        args = ["--listen", str(sock_dir / "p.sock")]
    if args[0] != "--local-containerd":  # it refuses a backend named besides
        args += ["--backend", str(sock_dir / "none.sock")]
    served = subprocess.run(
        ["sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", sys.executable, "-m", "runtimeproxy.cli", "serve",
         *args, "--hook-dir", str(sock_dir / "hooks"), "--log-format", "json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert served.returncode == 1, served.stderr
    assert "Traceback" not in served.stderr
    # Each a log line, none a traceback's (grpc's core logs a failed bind in its own format).
    lines = [json.loads(line) for line in served.stderr.splitlines() if not line.startswith("E")]
    (fatal,) = [line for line in lines if line["msg"] == "fatal"]
    assert fatal["error"].startswith(expected) and "exception" not in fatal
    assert (sock_dir / "file").read_text() == "precious"


def test_a_metrics_port_in_use_ends_serve_in_one_line_naming_the_address_and_the_error(sock_dir: Path) -> None:
    """Found only at the bind: before the proxy listens, nothing left behind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        served = subprocess.run(
            [sys.executable, "-m", "runtimeproxy.cli", "serve", "--listen", str(sock_dir / "p.sock"),
             "--backend", str(sock_dir / "none.sock"), "--hook-dir", str(sock_dir / "hooks"),
             "--metrics-listen", address, "--log-format", "json"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
    assert served.returncode == 1, served.stderr
    assert "Traceback" not in served.stderr
    (fatal,) = [line for line in map(json.loads, served.stderr.splitlines()) if line["msg"] == "fatal"]
    assert fatal["error"] == f"metrics-listen '{address}': cannot serve there: Address already in use (EADDRINUSE)"
    assert "exception" not in fatal
    assert not (sock_dir / "p.sock").exists()
