"""Child processes of the benchmark: proxies, the hook server, the load generator.

Every child gets its own session (a terminal's Ctrl-C reaches only the
orchestrator, which then stops them in order) and its stderr goes to a log
file whose tail is shown when it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.host.process import tail, terminate_process
from runtimeproxy.host.unixsocket import grpc_target

PROJECT_ROOT = Path(__file__).resolve().parents[1]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_LOG_TAIL_LINES = 30
_CLI_ENTRY = "import sys; from runtimeproxy.cli import main; sys.exit(main(prog_name='runtime-proxy'))"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def work_dir(prefix: str, keep: bool) -> Iterator[Path]:
    """A scratch directory under /tmp for one run, removed after it unless ``keep``."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield work
    finally:
        if keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


class BenchError(RuntimeError):
    pass


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_mib(pid: int) -> dict[str, float]:
    """Resident memory now and at its peak (VmRSS, VmHWM), in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return {"rss_mib": fields.get("VmRSS", 0.0), "peak_mib": fields.get("VmHWM", 0.0)}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # fields 14 and 15 of proc(5)


def machine_ticks() -> tuple[int, int]:
    """(idle, total) clock ticks of all CPUs since boot, from /proc/stat (idle includes iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def unit_nice(unit: Path = PROJECT_ROOT / "systemd" / "runtime-proxy.service") -> int:
    """The ``Nice=`` the proxy's systemd unit runs it at (0 if it sets none)."""
    for line in unit.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "Nice":
            return int(value)
    return 0


class Child:
    """One child process, started with ``start()`` and ended with ``stop()``;
    ``nice``: its scheduling niceness, as ``nice -n`` sets it."""

    def __init__(self, name: str, argv: list[str], log_path: Path, *, stdin_pipe: bool = False,
                 stdout_pipe: bool = False, nice: int = 0) -> None:
        self.name = name
        self.argv = ["nice", "-n", str(nice), *argv] if nice else argv
        self.log_path = log_path
        self._stdin_pipe = stdin_pipe
        self._stdout_pipe = stdout_pipe
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        with open(self.log_path, "ab") as log:  # noqa: ASYNC230 - the child's log, once per start, outside what is measured
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                cwd=PROJECT_ROOT,
                stdin=asyncio.subprocess.PIPE if self._stdin_pipe else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if self._stdout_pipe else log,
                stderr=log,
                start_new_session=True,
                limit=64 * 1024 * 1024,  # the load generator answers with long lines
            )

    def died(self) -> BenchError:
        code = self.proc.returncode if self.proc else None
        return BenchError(f"{self.name} exited (status {code}); log {self.log_path}:\n"
                          f"{tail(self.log_path, _LOG_TAIL_LINES)}")

    async def stop(self, grace: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:  # the load generator exits at EOF on stdin
            with contextlib.suppress(Exception):
                proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 3.0)
                return
        await terminate_process(proc, grace, self.name)


async def wait_cri_version(sock: Path, child: Child | None, timeout: float = 30.0) -> v1.VersionResponse:
    """Poll CRI Version on `sock` until it answers (the proxy answers UNAVAILABLE until its backend probe)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "socket missing"
    while loop.time() < deadline:
        if child is not None and not child.alive:
            raise child.died()
        if sock.exists():  # noqa: ASYNC240 - a stat while waiting for the child to listen, outside what is measured
            async with aio.insecure_channel(grpc_target(sock)) as channel:
                try:
                    return await v1_grpc.RuntimeServiceStub(channel).Version(v1.VersionRequest(), timeout=1.0)
                except aio.AioRpcError as err:
                    last = f"{err.code().name}: {err.details()}"
        await asyncio.sleep(0.1)
    raise BenchError(f"{sock} did not answer Version within {timeout}s (last: {last})")


async def wait_idle(pid: int, *, quiet_for: float = 0.6, step: float = 0.2, timeout: float = 30.0) -> float:
    """Wait until a process stops using CPU (e.g. the proxy's start-up state rebuild); returns seconds waited."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    quiet_needed = max(1, round(quiet_for / step))
    quiet = 0
    last = cpu_seconds(pid)
    while loop.time() - started < timeout:
        await asyncio.sleep(step)
        now = cpu_seconds(pid)
        quiet = quiet + 1 if now - last <= 1.0 / _CLK_TCK else 0
        last = now
        if quiet >= quiet_needed:
            break
    return loop.time() - started


class ReadyChild(Child):
    """A child that prints ``ready`` on stdout once it serves."""

    def __init__(self, name: str, argv: list[str], log_path: Path, nice: int = 0) -> None:
        super().__init__(name, argv, log_path, stdout_pipe=True, nice=nice)

    async def wait_ready(self, timeout: float = 20.0) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise BenchError(f"{self.name} not ready within {timeout}s:\n"
                             f"{tail(self.log_path, _LOG_TAIL_LINES)}") from None
        if line.strip() != b"ready":
            raise self.died() if not self.alive else BenchError(f"{self.name} said {line!r}")


# The no-op hook servers: every hook answers an empty response.
HOOK_SERVERS = {
    "sdk": ["-m", "hooks.testserver", "--config", "{}", "--socket"],  # the SDK's, on its frames transport
    "lean": ["-m", "bench.leanhook"],  # the same transport, no decode or handler (bench/leanhook.py)
}


class HookServerChild(ReadyChild):
    """A no-op hook server (``kind`` in :data:`HOOK_SERVERS`) listening on ``sock``."""

    def __init__(self, sock: Path, log_path: Path, kind: str = "sdk") -> None:
        super().__init__(f"{kind} hook server", [sys.executable, *HOOK_SERVERS[kind], str(sock)], log_path)
        self.sock = sock
        self.kind = kind


class RelayChild(ReadyChild):
    """A reference relay (:mod:`bench.relays`) in front of the same containerd."""

    def __init__(self, kind: str, listen: Path, backend: Path, log_path: Path, nice: int = 0) -> None:
        super().__init__(f"{kind} relay", [sys.executable, "-m", "bench.relays", kind, str(listen), str(backend)],
                         log_path, nice=nice)
        self.listen = listen


class ProxyChild(Child):
    def __init__(self, name: str, listen: Path, backend: Path, hook_dir: Path, log_path: Path,
                 metrics_port: int | None = None, data_path: str | None = None, event_loop: str | None = None,
                 nice: int = 0) -> None:
        # The console script's entry point, called directly: it does not depend on a `__main__`
        # guard in runtimeproxy/cli.py (older checkouts had none, and `-m` then exited doing nothing).
        argv = [sys.executable, "-c", _CLI_ENTRY, "serve", "--listen", str(listen),
                "--backend", str(backend), "--hook-dir", str(hook_dir), "--log-level", "warning"]
        if metrics_port is not None:
            argv += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
        if data_path is not None:  # only when asked for: older checkouts have no --data-path
            argv += ["--data-path", data_path]
        if event_loop is not None:  # only when asked for: older checkouts have no --event-loop
            argv += ["--event-loop", event_loop]
        super().__init__(name, argv, log_path, nice=nice)
        self.listen = listen
        self.metrics_port = metrics_port


class LoadGenChild(Child):
    """The load generator (:mod:`bench.loadgen`), one JSON line per command."""

    def __init__(self, log_path: Path) -> None:
        super().__init__("load generator", [sys.executable, "-m", "bench.loadgen"], log_path,
                         stdin_pipe=True, stdout_pipe=True)

    async def request(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        await self.proc.stdin.drain()
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise BenchError(f"load generator did not answer {cmd.get('op')} within {timeout}s") from None
        if not line:
            raise self.died()
        answer = json.loads(line)
        if not answer.get("ok"):
            raise BenchError(f"load generator failed: {answer.get('error')}")
        return answer
