"""``python -m bench node``: the proxy's cost under a real kubelet at rest.

A private containerd, the proxy as a process (`runtime-proxy serve`, no
hooks) and the node tier's kubelet with its static pods (tests/node: five
host-network pods, six running containers, an exec liveness probe). Once the
pods run and kubelet has settled, the proxy's CPU time (utime + stime from
/proc/PID/stat) and kubelet's own count of CRI calls
(`kubelet_runtime_operations_total` on its port) are read at the start and the
end of a measured interval; the proxy's resident memory at the end. kubelet's
and containerd's CPU shares are shown beside the proxy's for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimeproxy.host.containerd import LocalContainerd
from tests.node.binary import KubeletBinaryError, archive_path, unpacked_kubelet
from tests.node.noderun import NodeRun
from tests.node.proxyproc import ProxyProcess

from .procs import BenchError, cpu_seconds, memory_mib, say, work_dir


@dataclass(frozen=True)
class NodeOptions:
    duration: float = 60.0  # seconds measured
    idle: float = 10.0  # seconds the proxy's own idle CPU use is measured, before kubelet starts
    settle: float = 10.0  # seconds after the pods run, before measuring (kubelet's start-up bursts)
    json_path: Path | None = None
    keep: bool = False


def parse(argv: list[str]) -> NodeOptions:
    d = NodeOptions()
    p = argparse.ArgumentParser(prog="python -m bench node", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=d.duration, help=f"seconds measured [{d.duration:g}]")
    p.add_argument("--settle", type=float, default=d.settle,
                   help=f"seconds waited after the pods run, before measuring [{d.settle:g}]")
    p.add_argument("--idle", type=float, default=d.idle,
                   help=f"seconds the proxy is measured with no client, before kubelet starts [{d.idle:g}]")
    p.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs of every process)")
    a = p.parse_args(argv)
    if a.duration <= 0 or a.settle < 0 or a.idle <= 0:
        p.error("--duration and --idle must be > 0 and --settle >= 0")
    return NodeOptions(a.duration, a.idle, a.settle, a.json, a.keep)


async def measure(opts: NodeOptions, work: Path) -> dict[str, Any]:
    try:
        binary = unpacked_kubelet(archive_path(), work / "kubelet-bin")
    except KubeletBinaryError as exc:
        raise BenchError(f"{exc} (set RUNTIME_PROXY_SHARED to the shared directory)") from exc
    async with contextlib.AsyncExitStack() as stack:
        say("starting a private containerd")
        containerd = LocalContainerd(work / "ctd", log_level="warn")
        await containerd.start(timeout=120)
        stack.push_async_callback(containerd.stop)
        hook_dir = work / "hooks.d"
        hook_dir.mkdir(mode=0o755)
        proxy = ProxyProcess(work / "proxy", containerd.socket, hook_dir)
        proxy.base.mkdir()
        stack.push_async_callback(proxy.stop)
        say("starting the proxy")
        await proxy.start()
        say(f"measuring the idle proxy for {opts.idle:g} s")
        idle = await cpu_share(proxy.pid, opts.idle)
        say("starting kubelet with the node tier's static pods")
        run = await stack.enter_async_context(NodeRun(binary, work / "kubelet", containerd, proxy.socket))
        await run.wait_running()
        say(f"pods running; settling for {opts.settle:g} s, then measuring for {opts.duration:g} s")
        await asyncio.sleep(opts.settle)
        found = {"proxy": proxy.pid, "kubelet": run.kubelet.pid, "containerd": containerd.pid}
        pids = {name: pid for name, pid in found.items() if pid is not None}
        if len(pids) < len(found):
            raise BenchError(f"a process is gone before the measurement: {found}")
        loop = asyncio.get_running_loop()
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        calls0, errors0 = await run.kubelet.runtime_operations()
        t0 = loop.time()
        await asyncio.sleep(opts.duration)
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        calls1, errors1 = await run.kubelet.runtime_operations()
        elapsed = loop.time() - t0
        memory = memory_mib(pids["proxy"])
    calls = {op: (calls1[op] - calls0.get(op, 0)) / elapsed for op in calls1 if calls1[op] > calls0.get(op, 0)}
    errors = sum(errors1.values()) - sum(errors0.values())
    total = sum(calls.values())
    shares = {name: (cpu1[name] - cpu0[name]) / elapsed for name in pids}
    return {
        "seconds": elapsed,
        "kubelet_calls_per_s": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
        "kubelet_calls_per_s_total": total,
        "kubelet_call_errors": errors,
        "cpu_share": shares,  # CPU seconds per second: 1.0 is one core
        "proxy_idle_cpu_share": idle,
        "proxy_cpu_ms_per_call": 1000 * shares["proxy"] / total if total else float("nan"),
        "proxy_cpu_ms_per_call_above_idle": 1000 * (shares["proxy"] - idle) / total if total else float("nan"),
        "proxy_memory_mib": memory,
    }


async def cpu_share(pid: int, seconds: float) -> float:
    """CPU seconds per second `pid` used over the next `seconds`."""
    loop = asyncio.get_running_loop()
    cpu0, t0 = cpu_seconds(pid), loop.time()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - cpu0) / (loop.time() - t0)


def render(results: dict[str, Any]) -> str:
    lines = [f"kubelet at rest through the proxy, measured over {results['seconds']:.1f} s", "",
             "kubelet CRI calls per second (kubelet_runtime_operations_total):"]
    for op, rate in results["kubelet_calls_per_s"].items():
        lines.append(f"  {op:<20} {rate:6.2f}")
    lines.append(f"  {'total':<20} {results['kubelet_calls_per_s_total']:6.2f}"
                 f"   ({results['kubelet_call_errors']:g} failed)")
    lines += ["", "CPU share (% of one core):"]
    for name, share in results["cpu_share"].items():
        lines.append(f"  {name:<20} {100 * share:6.2f} %")
    memory = results["proxy_memory_mib"]
    lines += [f"  {'proxy, no client':<20} {100 * results['proxy_idle_cpu_share']:6.2f} %   (before kubelet started)",
              "", f"proxy CPU per kubelet call: {results['proxy_cpu_ms_per_call']:.2f} ms "
              f"({results['proxy_cpu_ms_per_call_above_idle']:.2f} ms above its idle use)",
              f"proxy memory: {memory['rss_mib']:.1f} MiB resident, {memory['peak_mib']:.1f} MiB peak"]
    return "\n".join(lines)


async def _run(opts: NodeOptions) -> dict[str, Any]:
    with work_dir("rpb-node-", opts.keep) as work:
        say(f"work directory {work}")
        return await measure(opts, work)


def main(argv: list[str]) -> int:
    opts = parse(argv)
    try:
        results = asyncio.run(_run(opts))
    except KeyboardInterrupt:
        print("bench node: interrupted; everything was stopped", file=sys.stderr)
        return 130
    except (BenchError, AssertionError, RuntimeError) as exc:
        print(f"bench node: {exc}", file=sys.stderr)
        return 1
    print(render(results))
    if opts.json_path is not None:
        opts.json_path.write_text(json.dumps(results, indent=2, sort_keys=True))
        print(f"JSON written to {opts.json_path}")
    return 0
