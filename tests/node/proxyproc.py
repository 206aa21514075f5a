"""The proxy as kubelet meets it in production: a `runtime-proxy serve` process, restartable."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.procs import Child, free_tcp_port
from runtimeproxy.host.process import tail
from runtimeproxy.host.unixsocket import grpc_target

from .kubelet import Samples, http_get, parse_metrics

_POLL = 0.1


class ProxyProcessError(RuntimeError):
    pass


class ProxyProcess:
    """`python -m runtimeproxy serve` in front of `backend`; `start()` waits until it serves."""

    def __init__(self, base: Path, backend: Path, hook_dir: Path, flags: tuple[str, ...] = ()) -> None:
        self.base = base
        self.socket = base / "proxy.sock"
        self.log_path = base / "proxy.log"
        self.metrics_port = free_tcp_port()
        argv = [sys.executable, "-m", "runtimeproxy", "serve", "--listen", str(self.socket),
                "--backend", str(backend), "--hook-dir", str(hook_dir), *flags,
                "--metrics-listen", f"127.0.0.1:{self.metrics_port}", "--log-format", "json"]
        self._child = Child("runtime-proxy", argv, self.log_path)
        self._log_offset = 0  # where the log of the latest start begins
        self.starts = 0

    @property
    def pid(self) -> int:
        return self._child.pid

    async def start(self, timeout: float = 30.0) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        await self._child.start()
        self.starts += 1
        await self._wait_serving(timeout)

    async def stop(self) -> None:
        await self._child.stop()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def _wait_serving(self, timeout: float) -> None:
        """Until the standard health service says SERVING: the backend is connected and probed."""
        last = "no answer"
        try:
            async with asyncio.timeout(timeout), aio.insecure_channel(grpc_target(self.socket)) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while True:
                    if not self._child.alive:
                        raise ProxyProcessError(f"the proxy exited:\n{tail(self.log_path)}")
                    try:
                        answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                        if answer.status == health_pb2.HealthCheckResponse.SERVING:
                            return
                        last = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
                    except aio.AioRpcError as exc:
                        last = f"{exc.code().name}: {exc.details()}"
                        if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                            raise ProxyProcessError(f"the proxy's health check failed: {last}") from None
                    await asyncio.sleep(_POLL)
        except TimeoutError:
            raise ProxyProcessError(f"the proxy was not serving within {timeout}s ({last}):\n"
                                    f"{tail(self.log_path)}") from None

    async def metrics(self) -> Samples:
        return parse_metrics((await asyncio.to_thread(http_get, f"http://127.0.0.1:{self.metrics_port}/metrics")).decode())

    async def hook_servers(self) -> float:
        """How many hook servers the proxy has registered, from its metrics."""
        return sum((await self.metrics()).get("runtime_proxy_hook_servers", {}).values())

    def listening_sockets(self) -> set[str]:
        """The paths of the unix sockets the proxy process listens on (its fds matched in /proc/net/unix)."""
        inodes = set()
        fds = Path(f"/proc/{self.pid}/fd")
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):  # an fd closed meanwhile
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        paths = set()
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            # Flags __SO_ACCEPTCON (0x10000): a listening socket.
            if len(fields) == 8 and fields[6] in inodes and int(fields[3], 16) & 0x10000:
                paths.add(os.path.normpath(fields[7]))  # grpc binds "///path"
        return paths

    def log_tail(self) -> str:
        return tail(self.log_path)

    def log_records(self, all_starts: bool = False) -> list[dict[str, Any]]:
        """The JSON log lines of the latest start, or of every start (a line
        still being written is left out)."""
        with open(self.log_path, "rb") as f:
            f.seek(0 if all_starts else self._log_offset)
            lines = f.read().split(b"\n")[:-1]
        records = []
        for line in lines:
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records
