"""The plain-text table and the JSON document of a run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .lifecycle import STEPS

REFERENCE_MODES = {"grpc-relay", "byte-relay"}
LIFECYCLE_TARGET = 1.05  # hooked lifecycle median at most 1.05x direct
HOOK_RTT_TARGET_MS = 2.0  # hook round trip p50 below 2 ms


def _f(value: float, fmt: str = "{:.3f}") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _x(value: float) -> str:
    return _f(value, "{:.2f}x")


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    lcm = results.get("lifecycle", {}).get("modes", {})
    if "proxy+hook" in lcm:
        value = lcm["proxy+hook"]["median_ratio"]
        out.append({"target": f"hooked lifecycle median <= {LIFECYCLE_TARGET:.2f}x direct",
                    "value": value, "shown": _x(value),
                    "pass": not math.isnan(value) and value <= LIFECYCLE_TARGET})
    rtt = results.get("hook_rtt")
    if rtt:
        value = rtt["p50_ms"]
        out.append({"target": f"hook round trip p50 < {HOOK_RTT_TARGET_MS:g} ms", "value": value,
                    "shown": _f(value) + " ms", "pass": not math.isnan(value) and value < HOOK_RTT_TARGET_MS})
    return out


def render(results: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    opts = results["options"]
    env = results.get("environment", {})
    add("=" * 100)
    add("runtime-proxy benchmark" + ("  (QUICK smoke mode: figures are indicative only)" if opts.get("quick") else ""))
    add(f"runtime: {env.get('runtime', '?')}; {env.get('cpus', '?')} CPUs; Python {env.get('python', '?')}; "
        f"grpcio {env.get('grpcio', '?')}; load average at start "
        + " ".join(f"{x:.2f}" for x in env.get("loadavg_at_start", ())))
    add(f"proxies: --data-path {opts.get('data_path') or '(not passed: their default)'}, "
        f"--event-loop {opts.get('event_loop') or '(not passed: their default)'}")
    add(f"ListContainers sees {results.get('list_containers_count', {})} containers "
        f"({opts['pods']} pods, {opts['containers']} created containers)")

    unary = results.get("unary", [])
    if unary:
        add("")
        add(f"1. Unary calls: direct containerd vs through the proxy (no hooks); {opts['rounds']} interleaved rounds "
            f"x {opts['duration']:g}s per target and case; latencies pooled over rounds")
        add(f"{'call':<15}{'conc':>5}  {'target':<7}{'calls':>9}{'calls/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'errors':>8}{'proxy CPU ms/call':>19}")
        for e in unary:
            for target in ("direct", "proxy"):
                t = e[target]
                cpu = _f(t.get("proxy_cpu_ms_per_call", math.nan)) if target == "proxy" else ""
                add(f"{e['method']:<15}{e['concurrency']:>5}  {target:<7}{t['calls']:>9}"
                    f"{_f(t['calls_per_s'], '{:.0f}'):>10}{_f(t['p50_ms']):>9}{_f(t['p99_ms']):>9}"
                    f"{t['errors']:>8}{cpu:>19}")
            r = e["ratios"]
            add(f"{'':<22}proxy/direct: p50 {_x(r['p50'])}  p99 {_x(r['p99'])}  throughput {_x(r['throughput'])}"
                f"  (per round {_f(r['throughput_round_min'], '{:.2f}')}..{_f(r['throughput_round_max'], '{:.2f}')})")

    lcy = results.get("lifecycle")
    if lcy:
        modes = lcy["modes"]
        add("")
        add("2. Pod lifecycle (RunPodSandbox, CreateContainer, StartContainer, StopContainer, RemoveContainer, "
            "StopPodSandbox, RemovePodSandbox),")
        add(f"   wall time per lifecycle; {opts['lifecycles']} interleaved iterations per mode after 1 warm-up each")
        add(f"{'mode':<12}{'n':>4}{'median ms':>11}{'p90 ms':>9}{'mean ms':>9}{'min ms':>9}{'max ms':>9}"
            f"{'median/direct':>15}{'p90/direct':>12}{'paired':>8}{'failed':>8}")
        for mode, m in modes.items():
            add(f"{mode:<12}{m['n']:>4}{_f(m['median_ms'], '{:.1f}'):>11}{_f(m['p90_ms'], '{:.1f}'):>9}"
                f"{_f(m['mean_ms'], '{:.1f}'):>9}{_f(m['min_ms'], '{:.1f}'):>9}{_f(m['max_ms'], '{:.1f}'):>9}"
                f"{_x(m['median_ratio']):>15}{_x(m['p90_ratio']):>12}{_x(m['paired_median_ratio']):>8}"
                f"{m['failures']:>8}")
        add("   (paired = median over iterations of mode/direct, the modes of an iteration running back to back)")
        if REFERENCE_MODES & modes.keys():
            add("   (reference relays, not the proxy: grpc-relay = a bare grpc.aio relay with no proxy code, the floor")
            add("    of the proxy's stack; byte-relay = a socket splice that never reads HTTP/2, the floor of any")
            add("    Python relay; see bench/relays.py)")
        add("   median per call (ms):")
        others = [mode for mode in modes if mode != "direct"]
        add(f"   {'call':<18}" + "".join(f"{mode:>12}" for mode in modes)
            + "".join(f"{'+' + mode:>12}" for mode in others))
        for step in STEPS:
            vals = [modes[mode]["step_median_ms"][step] for mode in modes]
            diffs = [modes[mode]["step_median_ms"][step] - modes["direct"]["step_median_ms"][step] for mode in others]
            add(f"   {step:<18}" + "".join(f"{_f(v, '{:.2f}'):>12}" for v in vals)
                + "".join(f"{_f(d, '{:+.2f}'):>12}" for d in diffs))

    rtt = results.get("hook_rtt")
    if rtt:
        add("")
        add(f"3. Hook round trip: grpc.aio unary PreCreateContainerHook ({rtt['request_bytes']} byte "
            f"ContainerResourceHookRequest) to the no-op hook server, concurrency 1")
        add(f"   calls {rtt['calls']}  p50 {_f(rtt['p50_ms'])} ms  p90 {_f(rtt['p90_ms'])} ms  "
            f"p99 {_f(rtt['p99_ms'])} ms  mean {_f(rtt['mean_ms'])} ms  ({_f(rtt['calls_per_s'], '{:.0f}')} calls/s)"
            f"  errors {rtt['errors']}")
    pm = (lcy or {}).get("proxy_metrics")
    if pm:
        add("   as seen inside the proxy (runtime_proxy_hook_duration_seconds _sum/_count over the recorded "
            "hooked lifecycles):")
        add(f"   all hooks: {pm['hook_calls']} calls, mean {_f(pm['hook_mean_ms'])} ms; outcomes "
            f"{ {k: int(v) for k, v in pm['outcomes'].items()} }")
        per = [f"{h} {v['count']}x {_f(v['mean_ms'])} ms" for h, v in pm["per_hook"].items() if v["count"]]
        for i in range(0, len(per), 3):
            add("     " + "; ".join(per[i:i + 3]))
        hc = pm.get("hooked_calls", {})
        if hc:
            add("   hooked CRI calls end to end inside the proxy (runtime_proxy_hooked_call_duration_seconds, mean):")
            items = [f"{m} {_f(v['mean_ms'], '{:.2f}')} ms" for m, v in hc.items()]
            for i in range(0, len(items), 4):
                add("     " + "; ".join(items[i:i + 4]))

    memory = results.get("memory") or {}
    if memory:
        add("")
        add("4. Proxy memory at the end of the run (after all of the above)")
        for name, m in memory.items():
            add(f"   {name:<12} RSS {m['rss_mib']:.1f} MiB  (peak {m['peak_mib']:.1f} MiB)")

    add("")
    add("Targets:")
    for v in verdicts(results):
        add(f"   {v['target']:<45} {v['shown']:>10}   {'PASS' if v['pass'] else 'FAIL'}")
    problems = results.get("problems") or []
    add("")
    add("Problems: " + ("none" if not problems else ""))
    for p in problems:
        add(f"   - {p}")
    if "wall_seconds" in results:
        add(f"(run took {results['wall_seconds']:.0f}s)")
    add("=" * 100)
    return "\n".join(lines)


def _clean(obj: Any) -> Any:
    """NaN is not JSON: write null."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(results: dict[str, Any], path: Path) -> None:
    doc = dict(results)
    doc["targets"] = verdicts(results)
    path.write_text(json.dumps(_clean(doc), indent=2, sort_keys=True) + "\n")
