"""The load generator: a child process driven over stdin/stdout.

    python -m bench.loadgen

One JSON object per line on stdin, one JSON answer per line on stdout:

* ``{"op": "ping"}`` -> ``{"ok": true, "pid": ...}``
* ``{"op": "run", "socket": PATH, "method": "/pkg.Service/Method",
  "request": BASE64, "concurrency": N, "duration": S, "warmup": S,
  "timeout": S, "codec": "raw" | "hook-container", "gap": S}`` ->
  ``{"ok": true, "latencies_ns": [...], "calls": n, "errors": n,
  "error_samples": [...], "elapsed": S, "warmup_calls": n}``
* ``{"op": "quit"}`` -> exits.

``codec`` ``raw`` sends the request bytes as they are and keeps the reply as
bytes (no per-call (de)serialisation: the client costs as little as grpc.aio
allows). ``hook-container`` makes the call the proxy makes to a hook server:
the request class of the hook point whose RPC ``method`` is (``HOOK_POINTS``;
``ContainerResourceHookRequest`` for the container hooks) serialised per
call and its response class decoded per call, on a channel with the proxy's
hook channel options.

``concurrency`` workers each loop ``await call(request)`` until ``duration``
has passed; a latency is recorded per successful call. With ``gap`` (seconds,
default 0) a worker waits that long after each call: calls as sparse as a pod
lifecycle's, whose processes sleep in between, instead of back to back. A ``warmup`` phase
with the same shape runs first and is not recorded. Channels are created once
per (socket, codec) and reused by every later round, so neither side pays
connection set-up inside a measurement. The garbage collector is paused
during a recorded phase.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import sys
import time
from typing import Any

from grpc import aio

from runtimeproxy.hookclient.grpcaio import CHANNEL_OPTIONS as HOOK_CHANNEL_OPTIONS
from runtimeproxy.hookpath.points import HOOK_POINTS, HookPoint
from runtimeproxy.host.unixsocket import grpc_target

_MIB = 1024 * 1024
CRI_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * _MIB),
    ("grpc.max_send_message_length", 16 * _MIB),
]
_ERROR_BACKOFF = 0.01  # a failing target must not turn a worker into a busy loop


def hook_point(method: str) -> HookPoint:
    """The hook point whose RPC is ``method`` (``/service/Method``)."""
    for point in HOOK_POINTS.values():
        if point.full_method == method:
            return point
    raise ValueError(f"{method} is not the RPC of a hook point")


class LoadGen:
    def __init__(self) -> None:
        self._channels: dict[tuple[str, str], aio.Channel] = {}
        self._calls: dict[tuple[str, str, str], Any] = {}

    def _callable(self, socket: str, method: str, codec: str) -> Any:
        key = (socket, method, codec)
        call = self._calls.get(key)
        if call is not None:
            return call
        channel = self._channels.get((socket, codec))
        if channel is None:
            options = HOOK_CHANNEL_OPTIONS if codec == "hook-container" else CRI_CHANNEL_OPTIONS
            channel = self._channels[(socket, codec)] = aio.insecure_channel(grpc_target(socket), options=options)
        if codec == "hook-container":
            point = hook_point(method)
            call = channel.unary_unary(
                method,
                request_serializer=point.request_type.SerializeToString,
                response_deserializer=point.response_type.FromString,
            )
        elif codec == "raw":
            call = channel.unary_unary(method)  # bytes in, bytes out
        else:
            raise ValueError(f"unknown codec {codec!r}")
        self._calls[key] = call
        return call

    async def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        codec = cmd.get("codec", "raw")
        call = self._callable(cmd["socket"], cmd["method"], codec)
        raw = base64.b64decode(cmd.get("request", ""))
        request: Any = hook_point(cmd["method"]).request_type.FromString(raw) if codec == "hook-container" else raw
        concurrency = int(cmd.get("concurrency", 1))
        timeout = float(cmd.get("timeout", 10.0))
        warmup = float(cmd.get("warmup", 0.0))
        gap = float(cmd.get("gap", 0.0))
        warmup_calls = 0
        if warmup > 0:
            warmup_calls = len((await self._phase(call, request, concurrency, warmup, timeout, gap))[0])
        gc.collect()
        gc.disable()
        try:
            latencies, errors, samples, elapsed = await self._phase(
                call, request, concurrency, float(cmd["duration"]), timeout, gap)
        finally:
            gc.enable()
        return {"ok": True, "latencies_ns": latencies, "calls": len(latencies), "errors": errors,
                "error_samples": samples, "elapsed": elapsed, "warmup_calls": warmup_calls}

    @staticmethod
    async def _phase(call: Any, request: Any, concurrency: int, duration: float,
                     timeout: float, gap: float = 0.0) -> tuple[list[int], int, list[str], float]:
        latencies: list[int] = []
        record = latencies.append
        errors = 0
        samples: list[str] = []
        clock = time.perf_counter_ns
        start = clock()
        end = start + int(duration * 1e9)

        async def worker() -> None:
            nonlocal errors
            while True:
                t0 = clock()
                if t0 >= end:
                    return
                try:
                    await call(request, timeout=timeout)
                except aio.AioRpcError as err:
                    errors += 1
                    if len(samples) < 5:
                        samples.append(f"{err.code().name}: {err.details()}")
                    await asyncio.sleep(_ERROR_BACKOFF)
                    continue
                record(clock() - t0)
                if gap:
                    await asyncio.sleep(gap)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, errors, samples, (clock() - start) / 1e9

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._calls.clear()


async def _main() -> int:
    loop = asyncio.get_running_loop()
    gen = LoadGen()
    out = sys.stdout
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return 0  # the orchestrator went away
            try:
                cmd = json.loads(line)
                op = cmd.get("op")
                if op == "quit":
                    return 0
                if op == "ping":
                    answer: dict[str, Any] = {"ok": True, "pid": os.getpid()}
                elif op == "run":
                    answer = await gen.run(cmd)
                else:
                    answer = {"ok": False, "error": f"unknown op {op!r}"}
            except Exception as exc:  # report, keep serving
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(answer, separators=(",", ":")) + "\n")
            out.flush()
    finally:
        await gen.close()


def main() -> int:
    try:
        return asyncio.run(_main())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
