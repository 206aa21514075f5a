"""The benchmark run: set-up, the three phases, clean-up."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import platform
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from hooks.sdk import write_hook_config
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.unixsocket import grpc_target

from . import hookcalls
from . import lifecycle as lc
from .procs import (
    HookServerChild,
    LoadGenChild,
    ProxyChild,
    RelayChild,
    cpu_seconds,
    free_tcp_port,
    machine_ticks,
    memory_mib,
    say,
    unit_nice,
    wait_cri_version,
    wait_idle,
    work_dir,
)
from .proxymetrics import ALL_HOOKS, fetch_metrics, hook_metrics
from .report import CONTROL_MODE, UNARY_REFERENCE, UNARY_REFERENCE_RATIOS
from .stats import correlation, median, median_interval, ratio, summarize

CRI = hookcalls.CRI

# Lifecycle modes that are not the proxy: what relaying alone costs (see bench/relays.py).
REFERENCE_RELAYS = {"grpc-relay": "grpc", "byte-relay": "bytes"}
# The hooked proxies' lifecycle modes -> the no-op hook server each calls (bench/procs.py HOOK_SERVERS).
HOOKED_MODES = {"proxy+hook": "sdk", "proxy+leanhook": "lean"}


@dataclass(frozen=True)
class Options:
    rounds: int = 5
    duration: float = 2.5  # seconds per unary round and target
    warmup: float = 0.3  # seconds before each recorded round (not recorded)
    concurrencies: tuple[int, ...] = (1, 16)
    lifecycles: int = 60  # recorded lifecycles per mode
    containers: int = 100
    pods: int = 2
    hook_rounds: int = 3
    hook_duration: float = 1.5
    json_path: Path | None = None
    keep: bool = False  # keep the work directory (logs) after the run
    quick: bool = False
    data_path: str | None = None  # the proxies' --data-path; None: not passed (their default)
    event_loop: str | None = None  # the proxies' --event-loop; None: not passed (their default)
    # The proxies' and reference relays' niceness; None: what systemd/runtime-proxy.service sets.
    proxy_nice: int | None = None


def quick_options(base: Options) -> Options:
    # replace(), not a new Options: every option not about the run's length stays as given.
    return replace(base, rounds=1, duration=0.8, warmup=0.15, lifecycles=3, hook_rounds=1, hook_duration=0.8,
                   quick=True)


class Bench:
    def __init__(self, opts: Options, work: Path) -> None:
        self.opts = opts
        self.work = work
        self.results: dict[str, Any] = {"options": {k: (str(v) if isinstance(v, Path) else v)
                                                    for k, v in opts.__dict__.items()}}
        self.problems: list[str] = []
        # The proxies run as their unit runs them, and the reference relays as the proxies.
        self.nice = unit_nice() if opts.proxy_nice is None else opts.proxy_nice

    # ------------------------------------------------------------------ setup

    async def run(self) -> dict[str, Any]:
        opts, work = self.opts, self.work
        t_start = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            say(f"work directory {work}")
            ctd = LocalContainerd(work / "ctd", log_level="warn")
            say("starting a private containerd")
            await ctd.start(timeout=120)
            stack.push_async_callback(self._stop_containerd, ctd)
            direct_sock = ctd.socket

            direct_channel = await stack.enter_async_context(aio.insecure_channel(ctd.address))
            direct = v1_grpc.RuntimeServiceStub(direct_channel)
            version = await direct.Version(v1.VersionRequest(), timeout=10)
            self.results["environment"] = self._environment(version)

            logs = work / "podlogs"
            say(f"creating {opts.pods} host-network pods and {opts.containers} containers (created, not started)")
            t0 = time.monotonic()
            await lc.populate(direct, logs, pods=opts.pods, containers=opts.containers)
            say(f"  done in {time.monotonic() - t0:.1f}s")

            # The no-op hook servers and the proxies: plain (an empty hook dir), and one per hook server
            # with it on every hook point.
            hook_servers: dict[str, HookServerChild] = {}
            for kind in HOOKED_MODES.values():
                server = HookServerChild(work / f"hook-{kind}.sock", work / f"hookserver-{kind}.log", kind)
                await server.start()
                stack.push_async_callback(server.stop)
                await server.wait_ready()
                hook_servers[kind] = server

            proxy_child = partial(ProxyChild, data_path=self.opts.data_path, event_loop=self.opts.event_loop,
                                  nice=self.nice)
            plain_dir = self._hook_dir("hooks-none")
            plain = proxy_child("proxy (no hooks)", work / "proxy.sock", direct_sock, plain_dir, work / "proxy.log")
            hooked: dict[str, ProxyChild] = {}
            metrics_ports: dict[str, int] = {}
            for mode, kind in HOOKED_MODES.items():
                hook_dir = self._hook_dir(f"hooks-{kind}")
                write_hook_config(hook_dir, "noop", hook_servers[kind].sock, ALL_HOOKS, failure_policy="Ignore")
                metrics_ports[mode] = free_tcp_port()
                hooked[mode] = proxy_child(f"proxy ({kind} no-op hook)", work / f"proxy-{kind}.sock", direct_sock,
                                           hook_dir, work / f"proxy-{kind}.log", metrics_port=metrics_ports[mode])
            proxies = {"proxy": plain, **hooked}
            for proxy in proxies.values():
                await proxy.start()
                stack.push_async_callback(proxy.stop)
            for proxy in proxies.values():
                await wait_cri_version(proxy.listen, proxy)
            # Each proxy reads every pod and container once at start-up: let that finish first.
            waited = await asyncio.gather(*(wait_idle(proxy.pid) for proxy in proxies.values()))
            say(f"proxies ready (start-up state rebuild settled after {max(waited):.1f}s)")
            for mode, port in metrics_ports.items():
                await self._check_hooks_registered(mode, port)

            loadgen = LoadGenChild(work / "loadgen.log")
            await loadgen.start()
            stack.push_async_callback(loadgen.stop)
            await loadgen.request({"op": "ping"}, timeout=30)

            # Reference relays, started before the unary phase whose third target is the byte relay;
            # both are lifecycle modes and idle in the phases between.
            relays = await self._start_relays(stack, direct_sock)
            targets = {"direct": direct_sock, "proxy": plain.listen, UNARY_REFERENCE: relays[UNARY_REFERENCE].listen}
            await self._sanity(targets | {mode: proxy.listen for mode, proxy in hooked.items()}
                               | {name: relay.listen for name, relay in relays.items()})

            # Whose CPU time each unary round samples: the runtime and the client in every
            # round, the process in the middle (proxy, byte relay) in its own target's.
            pids = {"runtime": ctd.pid, "client": loadgen.pid, "proxy": plain.pid,
                    UNARY_REFERENCE: relays[UNARY_REFERENCE].pid}
            await self._unary(loadgen, targets, pids)
            await self._hook_calls(loadgen, hook_servers, targets, logs)

            chans = {"direct": direct_channel}
            listeners = {mode: proxy.listen for mode, proxy in proxies.items()} | {
                name: relay.listen for name, relay in relays.items()}
            for name, listen in listeners.items():
                chans[name] = await stack.enter_async_context(aio.insecure_channel(grpc_target(listen)))
            chans[CONTROL_MODE] = await stack.enter_async_context(aio.insecure_channel(ctd.address))
            await self._lifecycles({n: v1_grpc.RuntimeServiceStub(c) for n, c in chans.items()}, direct, logs,
                                   metrics_ports)
            self.results["memory"] = {name: memory_mib(proxy.pid) for name, proxy in proxies.items() if proxy.alive}
            for proxy in proxies.values():
                if not proxy.alive:
                    self.problems.append(f"{proxy.name} died during the run: see {proxy.log_path}")
            say("cleaning up")
        self.results["problems"] = self.problems
        self.results["wall_seconds"] = time.monotonic() - t_start
        return self.results

    async def _start_relays(self, stack: contextlib.AsyncExitStack, backend: Path) -> dict[str, RelayChild]:
        work = self.work
        relays = {name: RelayChild(kind, work / f"{kind}-relay.sock", backend, work / f"{kind}-relay.log",
                                   nice=self.nice)
                  for name, kind in REFERENCE_RELAYS.items()}
        for relay in relays.values():
            await relay.start()
            stack.push_async_callback(relay.stop)
            await relay.wait_ready()
            await wait_cri_version(relay.listen, relay)
        return relays

    async def _stop_containerd(self, ctd: LocalContainerd) -> None:
        await ctd.stop(timeout=60)

    def _environment(self, version: v1.VersionResponse) -> dict[str, Any]:
        return {
            "cpus": os.cpu_count(),
            "loadavg_at_start": os.getloadavg(),
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "runtime": f"{version.runtime_name} {version.runtime_version} (CRI {version.runtime_api_version})",
            "kernel": platform.release(),
            "proxy_nice": self.nice,
        }

    def _hook_dir(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(mode=0o755)
        os.chmod(path, 0o755)
        return path

    async def _check_hooks_registered(self, mode: str, port: int) -> None:
        families = await fetch_metrics(self.problems, port)
        servers = families.get("runtime_proxy_hook_servers", {}).get((), math.nan)
        if servers != 1:
            self.problems.append(f"{mode} reports runtime_proxy_hook_servers={servers}, expected 1")

    async def _sanity(self, targets: dict[str, Path]) -> None:
        """Each target lists the same containers (so the proxies really relay)."""
        counts = {}
        for name, sock in targets.items():
            async with aio.insecure_channel(grpc_target(sock)) as ch:
                resp = await v1_grpc.RuntimeServiceStub(ch).ListContainers(v1.ListContainersRequest(), timeout=10)
                counts[name] = len(resp.containers)
        self.results["list_containers_count"] = counts
        if len(set(counts.values())) != 1:
            self.problems.append(f"ListContainers counts differ between targets: {counts}")
        say(f"ListContainers returns {counts}")

    # ------------------------------------------------------------------ phase 1

    async def _unary(self, loadgen: LoadGenChild, targets: dict[str, Path], pids: dict[str, int | None]) -> None:
        opts = self.opts
        list_bytes = v1.ListContainersRequest().SerializeToString()
        cases = [(m, c) for m in ("Version", "ListContainers") for c in opts.concurrencies]
        per_round = len(cases) * len(targets) * (opts.duration + opts.warmup)
        say(f"unary calls: {opts.rounds} rounds x {len(cases)} cases x {len(targets)} targets "
            f"(~{opts.rounds * per_round:.0f}s)")
        raw: dict[tuple[str, int], dict[str, dict[str, Any]]] = {
            case: {t: {"lat": [], "calls": 0, "elapsed": 0.0, "errors": 0, "samples": [], "rounds": [],
                       "cpu": {"runtime": 0.0, "client": 0.0, "middle": 0.0}, "idle": 0, "ticks": 0,
                       "all_calls": 0}
                   for t in targets}
            for case in cases}
        for r in range(opts.rounds):
            for case in cases:
                method, conc = case
                order = list(targets) if (r + cases.index(case)) % 2 == 0 else list(reversed(targets))
                for target in order:
                    cmd = {"op": "run", "socket": str(targets[target]), "method": CRI + method,
                           "request": base64.b64encode(list_bytes if method == "ListContainers" else b"").decode(),
                           "concurrency": conc, "duration": opts.duration, "warmup": opts.warmup,
                           "timeout": 10.0, "codec": "raw"}
                    watched = {who: pid for who, pid in (("runtime", pids["runtime"]), ("client", pids["client"]),
                                                         ("middle", pids.get(target))) if pid is not None}
                    cpu0 = {who: cpu_seconds(pid) for who, pid in watched.items()}
                    ticks0 = machine_ticks()
                    ans = await loadgen.request(cmd, timeout=opts.duration + opts.warmup + 60)
                    ticks1 = machine_ticks()
                    acc = raw[case][target]
                    for who, before in cpu0.items():
                        acc["cpu"][who] += cpu_seconds(watched[who]) - before
                    acc["idle"] += ticks1[0] - ticks0[0]
                    acc["ticks"] += ticks1[1] - ticks0[1]
                    acc["lat"].extend(ans["latencies_ns"])
                    acc["calls"] += ans["calls"]
                    acc["all_calls"] += ans["calls"] + ans["warmup_calls"]
                    acc["elapsed"] += ans["elapsed"]
                    acc["errors"] += ans["errors"]
                    acc["samples"] += ans["error_samples"]
                    acc["rounds"].append(ans["calls"] / ans["elapsed"] if ans["elapsed"] else math.nan)
            say(f"  round {r + 1}/{opts.rounds} done")

        out = []
        for (method, conc), by_target in raw.items():
            entry: dict[str, Any] = {"method": method, "concurrency": conc}
            for target, acc in by_target.items():
                s = summarize(x / 1e6 for x in acc["lat"])  # ms
                entry[target] = {
                    "calls": acc["calls"], "errors": acc["errors"], "error_samples": acc["samples"][:5],
                    "calls_per_s": acc["calls"] / acc["elapsed"] if acc["elapsed"] else math.nan,
                    "p50_ms": s["p50"], "p99_ms": s["p99"], "mean_ms": s["mean"],
                    "calls_per_s_by_round": acc["rounds"],
                }
                if acc["errors"]:
                    self.problems.append(f"{method} c={conc} via {target}: {acc['errors']} errors, "
                                         f"e.g. {acc['samples'][:2]}")
            entry["ratios"] = _ratios(entry["direct"], entry["proxy"])
            if UNARY_REFERENCE in entry:
                entry[UNARY_REFERENCE_RATIOS] = _ratios(entry["direct"], entry[UNARY_REFERENCE])
            # CPU time was sampled around warm-up and recorded phase: divided by all their calls.
            for target, acc in by_target.items():
                per_call = {who: seconds * 1000 / acc["all_calls"] if acc["all_calls"] else math.nan
                            for who, seconds in acc["cpu"].items()}
                entry[target]["runtime_cpu_ms_per_call"] = per_call["runtime"]
                entry[target]["client_cpu_ms_per_call"] = per_call["client"]
                entry[target]["idle_percent"] = 100 * acc["idle"] / acc["ticks"] if acc["ticks"] else math.nan
                if target != "direct":
                    entry[target][f"{'proxy' if target == 'proxy' else 'relay'}_cpu_ms_per_call"] = per_call["middle"]
            out.append(entry)
        self.results["unary"] = out

    # ------------------------------------------------------------------ phase 3

    async def _hook_calls(self, loadgen: LoadGenChild, servers: dict[str, HookServerChild],
                          targets: dict[str, Path], logs: Path) -> None:
        opts = self.opts
        for kind, server in servers.items():
            self.results["hook_rtt" if kind == "sdk" else f"hook_rtt_{kind}"] = await hookcalls.round_trip(
                loadgen, server.sock, logs, rounds=opts.hook_rounds, duration=opts.hook_duration,
                warmup=opts.warmup, problems=self.problems, server=kind)
        hook_socks = {"hook" if kind == "sdk" else f"{kind} hook": server.sock for kind, server in servers.items()}
        self.results["sparse"] = await hookcalls.sparse(
            loadgen, hook_socks, targets, logs, duration=opts.hook_rounds * opts.hook_duration, warmup=opts.warmup,
            problems=self.problems)

    # ------------------------------------------------------------------ phase 2

    async def _lifecycles(self, stubs: dict[str, v1_grpc.RuntimeServiceStub], direct: v1_grpc.RuntimeServiceStub,
                          logs: Path, metrics_ports: dict[str, int]) -> None:
        opts = self.opts
        modes = list(stubs)
        say(f"pod lifecycles: 1 warm-up + {opts.lifecycles} recorded per mode, interleaved ({', '.join(modes)})")
        results: dict[str, list[lc.LifecycleResult]] = {m: [] for m in modes}
        by_iteration: list[dict[str, float]] = []  # mode -> total seconds, for paired ratios
        failures: dict[str, list[str]] = {m: [] for m in modes}

        async def one(mode: str, name: str) -> lc.LifecycleResult | None:
            try:
                return await lc.lifecycle(stubs[mode], direct, logs, name)
            except lc.LifecycleError as err:
                failures[mode].append(str(err))
                return None

        for mode in modes:  # warm-up: channels, proxy code paths, hook channel
            await one(mode, f"warm-{mode.replace('+', '-')}")
        for mode in modes:  # warm-up failures are failures too, but not timings
            if failures[mode]:
                self.problems.append(f"lifecycle via {mode} failed during warm-up: {failures[mode][0]}")
        before = {mode: await fetch_metrics(self.problems, port) for mode, port in metrics_ports.items()}
        for i in range(opts.lifecycles):
            rotated = modes[i % len(modes):] + modes[:i % len(modes)]
            iteration: dict[str, float] = {}
            for mode in rotated:
                res = await one(mode, f"lc{i}-{mode.replace('+', '-')}")
                if res is not None:
                    results[mode].append(res)
                    iteration[mode] = res.total
            by_iteration.append(iteration)
            if (i + 1) % 5 == 0 or i + 1 == opts.lifecycles:
                say(f"  {i + 1}/{opts.lifecycles} iterations done")
        after = {mode: await fetch_metrics(self.problems, port) for mode, port in metrics_ports.items()}

        out: dict[str, Any] = {"modes": {}}
        for mode in modes:
            totals = [r.total * 1000 for r in results[mode]]
            s = summarize(totals)
            out["modes"][mode] = {
                "n": len(totals), "failures": len(failures[mode]), "failure_samples": failures[mode][:3],
                "median_ms": s["p50"], "p90_ms": s["p90"], "mean_ms": s["mean"], "min_ms": s["min"],
                "max_ms": s["max"],
                "step_median_ms": {step: median(r.steps[step] * 1000 for r in results[mode]) for step in lc.STEPS},
            }
            if failures[mode]:
                self.problems.append(f"lifecycle via {mode}: {len(failures[mode])} failures, "
                                     f"e.g. {failures[mode][0]}")
        base = out["modes"]["direct"]
        for mode in modes:
            m = out["modes"][mode]
            m["median_ratio"] = ratio(m["median_ms"], base["median_ms"])
            m["p90_ratio"] = ratio(m["p90_ms"], base["p90_ms"])
            # The modes of one iteration run back to back: the median of their ratios cancels slow drifts.
            both = [(it["direct"], it[mode]) for it in by_iteration if mode in it and "direct" in it]
            paired = [x / d for d, x in both]
            m["paired_median_ratio"] = median(paired)
            m["paired_interval90"] = median_interval(paired)
            m["direct_correlation"] = correlation([d for d, _ in both], [x for _, x in both])
        for mode in metrics_ports:
            key = "proxy_metrics" if mode == "proxy+hook" else f"proxy_metrics_{HOOKED_MODES[mode]}"
            out[key] = hook_metrics(self.problems, before[mode], after[mode],
                                    len(results[mode]) + len(failures[mode]), mode)
        self.results["lifecycle"] = out


def _ratios(direct: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """other / direct for one unary case: pooled p50, p99, throughput, and throughput per round."""
    paired = [ratio(b, a) for a, b in zip(direct["calls_per_s_by_round"], other["calls_per_s_by_round"],
                                         strict=True)]
    return {
        "p50": ratio(other["p50_ms"], direct["p50_ms"]),
        "p99": ratio(other["p99_ms"], direct["p99_ms"]),
        "throughput": ratio(other["calls_per_s"], direct["calls_per_s"]),
        "throughput_by_round": paired,
        "throughput_round_min": min(paired), "throughput_round_max": max(paired),
    }


async def run(opts: Options) -> dict[str, Any]:
    with work_dir("rpb-", opts.keep) as work:
        return await Bench(opts, work).run()
