"""Phase 3: hook calls made straight to the no-op hook servers, back to back and sparse."""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

from . import lifecycle as lc
from .procs import LoadGenChild, say
from .stats import summarize

CRI = "/runtime.v1.RuntimeService/"
HOOK_METHOD = HOOK_POINTS[HookType.PRE_CREATE_CONTAINER].full_method
# A pod lifecycle's calls are tens of milliseconds apart: the sparse measurement's pause between calls.
SPARSE_GAP_S = 0.02


async def round_trip(loadgen: LoadGenChild, hook_sock: Path, logs: Path, *, rounds: int, duration: float,
                     warmup: float, problems: list[str], server: str) -> dict[str, Any]:
    """Back-to-back PreCreateContainerHook calls at concurrency 1 to one hook server."""
    request = lc.hook_request(logs).SerializeToString()
    say(f"hook round trip: {rounds} x {duration}s of PreCreateContainerHook ({len(request)} byte request) "
        f"to the {server} no-op hook server")
    lat: list[int] = []
    calls = errors = 0
    elapsed = 0.0
    samples: list[str] = []
    for _ in range(rounds):
        ans = await loadgen.request({
            "op": "run", "socket": str(hook_sock), "method": HOOK_METHOD,
            "request": base64.b64encode(request).decode(), "concurrency": 1,
            "duration": duration, "warmup": warmup, "timeout": 2.0,
            "codec": "hook-container"}, timeout=duration + warmup + 60)
        lat += ans["latencies_ns"]
        calls += ans["calls"]
        errors += ans["errors"]
        elapsed += ans["elapsed"]
        samples += ans["error_samples"]
    s = summarize(x / 1e6 for x in lat)
    if errors:
        problems.append(f"{server} hook server calls failed {errors} times, e.g. {samples[:2]}")
    return {"server": server, "calls": calls, "errors": errors, "error_samples": samples[:5],
            "request_bytes": len(request), "p50_ms": s["p50"], "p90_ms": s["p90"], "p99_ms": s["p99"],
            "mean_ms": s["mean"], "calls_per_s": calls / elapsed if elapsed else math.nan}


async def sparse(loadgen: LoadGenChild, hook_socks: dict[str, Path], targets: dict[str, Path], logs: Path, *,
                 duration: float, warmup: float, problems: list[str]) -> dict[str, Any]:
    """Calls as sparse as a pod lifecycle's (every process sleeps in between): what each
    hook call and each hop costs there, which back-to-back rounds do not show.
    ``hook_socks``: result name ("hook", "lean hook") -> hook server socket."""
    say(f"sparse calls: one every {SPARSE_GAP_S * 1000:g} ms for {duration:g}s to each hook server, and Version")
    request = lc.hook_request(logs).SerializeToString()
    runs = {**{name: (sock, HOOK_METHOD, request, "hook-container") for name, sock in hook_socks.items()},
            **{f"Version {t}": (sock, CRI + "Version", b"", "raw") for t, sock in targets.items()}}
    out: dict[str, Any] = {"gap_ms": SPARSE_GAP_S * 1000}
    for name, (sock, method, body, codec) in runs.items():
        ans = await loadgen.request({
            "op": "run", "socket": str(sock), "method": method, "request": base64.b64encode(body).decode(),
            "concurrency": 1, "duration": duration, "warmup": warmup, "timeout": 5.0, "codec": codec,
            "gap": SPARSE_GAP_S}, timeout=duration + warmup + 60)
        s = summarize(x / 1e6 for x in ans["latencies_ns"])
        out[name] = {"calls": ans["calls"], "errors": ans["errors"], "p50_ms": s["p50"], "p90_ms": s["p90"]}
        if ans["errors"]:
            problems.append(f"sparse {name} calls failed {ans['errors']} times, e.g. {ans['error_samples'][:2]}")
    return out
