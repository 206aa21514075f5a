"""The plain-text table and the JSON document of a run."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .lifecycle import STEPS
from .stats import ratio

REFERENCE_MODES = {"grpc-relay", "byte-relay"}
# A second channel straight to containerd, run as a lifecycle mode of its own: an A/A control. With no
# noise its paired ratio would be 1.00x; how far it lands from that is how far the lifecycle measure
# moves by itself in a run (runc, containerd, the kernel), which no relay or proxy adds. Never judged.
CONTROL_MODE = "direct-again"
# The unary phase's third target beside direct and proxy (bench/relays.py "bytes"): the floor of any
# Python relay on this machine, shown for reference and never judged.
UNARY_REFERENCE = "byte-relay"
UNARY_REFERENCE_RATIOS = "ratios_byte_relay"

# Issue 14's targets, as ratios to direct containerd in the same run.
VERSION_P50_TARGET = 1.5  # Version p50 at concurrency 1 ...
VERSION_P50_CONCURRENCY = 1
VERSION_THROUGHPUT_TARGET = 0.6  # ... and throughput at concurrency 16
VERSION_THROUGHPUT_CONCURRENCY = 16
LIST_P50_TARGET = 1.3  # ListContainers p50 at every concurrency measured
# Judged on the paired median (per iteration, mode / direct): the machine drifts by
# a third within a run, and a mode's lifecycles follow that drift with direct's
# (correlation 0.4-0.9 here), which the ratio of two medians does not cancel.
PLAIN_LIFECYCLE_TARGET = 1.02  # lifecycle without hooks (mode "proxy")
LIFECYCLE_TARGET = 1.05  # hooked lifecycle at most 1.05x direct, with either no-op hook server:
# the SDK's (mode "proxy+hook"), and the lean one (mode "proxy+leanhook", bench/leanhook.py) whose own
# CPU per call is below the SDK's, as a compiled hook server's is
HOOK_RTT_TARGET_MS = 2.0  # hook round trip p50 below 2 ms
CPU_DIVISOR = 3  # proxy CPU per relayed call at most a third of today's; RSS no higher than today's


@dataclass(frozen=True)
class Baseline:
    """The figures of "today" in issue 14's sense, from a recorded run: absolute, so only comparable
    on the machine they were measured on. A figure missing here is shown without a verdict."""

    source: str
    cpu_ms_per_call: tuple[tuple[str, int, float], ...]  # (method, concurrency, proxy CPU ms per call)
    rss_mib: tuple[tuple[str, float], ...]  # (proxy, VmRSS at the end of the run)

    def cpu(self, method: str, concurrency: int) -> float | None:
        return next((v for m, c, v in self.cpu_ms_per_call if (m, c) == (method, concurrency)), None)

    def rss(self, proxy: str) -> float | None:
        return next((v for p, v in self.rss_mib if p == proxy), None)


# bench/README.md "Data paths compared", column grpc (the data path issue 14 replaces).
GRPC_PATH = Baseline("grpc path", cpu_ms_per_call=(("Version", 1, 1.11),), rss_mib=(("proxy", 59.9),))

_ABSENT = object()
_STEP_COLUMN = 16  # "+proxy+leanhook" and a space


def _f(value: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _x(value: float | None) -> str:
    return _f(value, "{:.2f}x")


def _interval(bounds: Any) -> str:
    lo, hi = bounds
    return f"{_f(lo, '{:.2f}')}-{_f(hi, '{:.2f}')}"


def _dig(obj: Any, *keys: Any) -> Any:
    """obj[k1][k2]..., or _ABSENT when a level is missing (a phase or case not measured)."""
    for key in keys:
        if not isinstance(obj, dict) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


def _verdict(target: str, value: float | None, shown: str, ok: Callable[[float], bool]) -> dict[str, Any]:
    # A figure that exists but is NaN / null (no successful call, say) fails: it was meant to be measured.
    passed = value is not None and not math.isnan(value) and ok(value)
    return {"target": target, "value": value, "shown": shown, "pass": passed}


def _at_most(limit: float) -> Callable[[float], bool]:
    # Bound here, not read from a loop's variable by a lambda in the loop (each sees its own limit).
    return lambda v: v <= limit


def _unary_cases(results: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(e["method"], e["concurrency"]): e for e in results.get("unary") or ()}


def _unary_verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    cases = _unary_cases(results)
    value = _dig(cases, ("Version", VERSION_P50_CONCURRENCY), "ratios", "p50")
    if value is not _ABSENT:
        out.append(_verdict(f"Version c{VERSION_P50_CONCURRENCY} p50 <= {VERSION_P50_TARGET:.2f}x direct",
                            value, _x(value), lambda v: v <= VERSION_P50_TARGET))
    value = _dig(cases, ("Version", VERSION_THROUGHPUT_CONCURRENCY), "ratios", "throughput")
    if value is not _ABSENT:
        out.append(_verdict(f"Version c{VERSION_THROUGHPUT_CONCURRENCY} throughput >= "
                            f"{VERSION_THROUGHPUT_TARGET:.2f}x direct",
                            value, _x(value), lambda v: v >= VERSION_THROUGHPUT_TARGET))
    containers = results.get("options", {}).get("containers", "?")
    for (method, conc), entry in cases.items():
        if method != "ListContainers":
            continue
        value = _dig(entry, "ratios", "p50")
        if value is not _ABSENT:
            out.append(_verdict(f"ListContainers ({containers}) c{conc} p50 <= {LIST_P50_TARGET:.2f}x direct",
                                value, _x(value), lambda v: v <= LIST_P50_TARGET))
    return out


def _lifecycle_verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for mode, what, limit in (("proxy", "lifecycle without hooks", PLAIN_LIFECYCLE_TARGET),
                              ("proxy+hook", "hooked lifecycle (SDK hook server)", LIFECYCLE_TARGET),
                              ("proxy+leanhook", "hooked lifecycle (lean hook server)", LIFECYCLE_TARGET)):
        value = _dig(results, "lifecycle", "modes", mode, "paired_median_ratio")
        if value is not _ABSENT:
            out.append(_verdict(f"{what} paired median <= {limit:.2f}x direct", value, _paired(results, mode),
                                _at_most(limit)))
    return out


def _paired(results: dict[str, Any], mode: str) -> str:
    """A lifecycle mode's paired median as shown, with its 90% interval when measured."""
    shown = _x(_dig(results, "lifecycle", "modes", mode, "paired_median_ratio"))
    interval = _dig(results, "lifecycle", "modes", mode, "paired_interval90")
    return shown if interval is _ABSENT else f"{shown} (90% interval {_interval(interval)})"


def _baseline_figures(results: dict[str, Any], baseline: Baseline) -> tuple[list[dict[str, Any]],
                                                                            list[dict[str, Any]]]:
    """Proxy CPU per call and RSS: judged where the baseline has the figure, listed unjudged otherwise."""
    judged: list[dict[str, Any]] = []
    shown_only: list[dict[str, Any]] = []
    for (method, conc), entry in _unary_cases(results).items():
        value = _dig(entry, "proxy", "proxy_cpu_ms_per_call")
        if value is _ABSENT:
            continue
        what, shown, today = f"proxy CPU per {method} call c{conc}", _f(value) + " ms", baseline.cpu(method, conc)
        if today is None:
            shown_only.append({"figure": what, "value": value, "shown": shown})
        else:
            limit = today / CPU_DIVISOR
            judged.append(_verdict(f"{what} <= {limit:.2f} ms ({baseline.source} {today:g} ms / {CPU_DIVISOR})",
                                   value, shown, _at_most(limit)))
    for proxy, m in (results.get("memory") or {}).items():
        value = _dig(m, "rss_mib")
        if value is _ABSENT:
            continue
        what, shown, today = f"{proxy} RSS at the end", _f(value, "{:.1f}") + " MiB", baseline.rss(proxy)
        if today is None:
            shown_only.append({"figure": what, "value": value, "shown": shown})
        else:
            judged.append(_verdict(f"{what} <= {today:g} MiB ({baseline.source})", value, shown,
                                   _at_most(today)))
    return judged, shown_only


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 14's targets that this run measured; a target whose data is missing gets no verdict."""
    out = _unary_verdicts(results) + _lifecycle_verdicts(results)
    value = _dig(results, "hook_rtt", "p50_ms")
    if value is not _ABSENT:
        out.append(_verdict(f"hook round trip p50 < {HOOK_RTT_TARGET_MS:g} ms", value, _f(value) + " ms",
                            lambda v: v < HOOK_RTT_TARGET_MS))
    return out + _baseline_figures(results, GRPC_PATH)[0]


def control(results: dict[str, Any]) -> dict[str, Any] | None:
    """The A/A control's paired median (CONTROL_MODE), shown beside the lifecycle verdicts; None if not run."""
    value = _dig(results, "lifecycle", "modes", CONTROL_MODE, "paired_median_ratio")
    if value is _ABSENT:
        return None
    return {"figure": f"{CONTROL_MODE}: direct again, paired median (1.00x if the measure had no noise)",
            "value": value, "shown": _paired(results, CONTROL_MODE)}


def unjudged(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Figures of a target measured against today's whose baseline was never recorded: shown, not judged."""
    return _baseline_figures(results, GRPC_PATH)[1]


def _proxy_metrics(add: Callable[[str], None], mode: str, pm: dict[str, Any]) -> None:
    add(f"   {mode}, as seen inside the proxy (runtime_proxy_hook_duration_seconds _sum/_count over the recorded "
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
        f"--event-loop {opts.get('event_loop') or '(not passed: their default)'}; "
        f"proxies and reference relays at nice {env.get('proxy_nice', 0)}, hook servers and containerd at 0")
    add(f"ListContainers sees {results.get('list_containers_count', {})} containers "
        f"({opts['pods']} pods, {opts['containers']} created containers)")

    unary = results.get("unary", [])
    if unary:
        reference = any(UNARY_REFERENCE in e for e in unary)
        add("")
        add("1. Unary calls: direct containerd vs through the proxy (no hooks)"
            + (f" and through the {UNARY_REFERENCE} (a reference)" if reference else "")
            + f"; {opts['rounds']} interleaved rounds x {opts['duration']:g}s per target and case; "
            "latencies pooled over rounds")
        add(f"{'call':<15}{'conc':>5}  {'target':<11}{'calls':>9}{'calls/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'errors':>8}   CPU ms/call: {'own':>6}{'runtime':>8}{'client':>7}{'idle':>7}")
        for e in unary:
            for target in ("direct", "proxy", UNARY_REFERENCE):
                if target not in e:
                    continue
                t = e[target]
                own = t.get("proxy_cpu_ms_per_call", t.get("relay_cpu_ms_per_call"))
                idle = t.get("idle_percent", math.nan)
                add(f"{e['method']:<15}{e['concurrency']:>5}  {target:<11}{t['calls']:>9}"
                    f"{_f(t['calls_per_s'], '{:.0f}'):>10}{_f(t['p50_ms']):>9}{_f(t['p99_ms']):>9}"
                    f"{t['errors']:>8}{'':>16}{'' if own is None else _f(own):>6}"
                    f"{_f(t.get('runtime_cpu_ms_per_call', math.nan)):>8}"
                    f"{_f(t.get('client_cpu_ms_per_call', math.nan)):>7}"
                    f"{'n/a' if math.isnan(idle) else f'{idle:.0f}%':>7}")
            r = e["ratios"]
            add(f"{'':<22}proxy/direct: p50 {_x(r['p50'])}  p99 {_x(r['p99'])}  throughput {_x(r['throughput'])}"
                f"  (per round {_f(r['throughput_round_min'], '{:.2f}')}..{_f(r['throughput_round_max'], '{:.2f}')})")
            rr = e.get(UNARY_REFERENCE_RATIOS)
            if rr:
                add(f"{'':<17}{UNARY_REFERENCE}/direct: p50 {_x(rr['p50'])}  throughput {_x(rr['throughput'])}"
                    "  (reference, not judged)")
        if reference:
            add(f"   ({UNARY_REFERENCE} = a socket splice that never reads HTTP/2: the floor of any Python relay on "
                "this machine; see bench/relays.py)")

    lcy = results.get("lifecycle")
    if lcy:
        modes = lcy["modes"]
        add("")
        add("2. Pod lifecycle (RunPodSandbox, CreateContainer, StartContainer, StopContainer, RemoveContainer, "
            "StopPodSandbox, RemovePodSandbox),")
        add(f"   wall time per lifecycle; {opts['lifecycles']} interleaved iterations per mode after 1 warm-up each")
        add(f"{'mode':<15}{'n':>4}{'median ms':>11}{'p90 ms':>9}{'mean ms':>9}{'min ms':>9}{'max ms':>9}"
            f"{'median/direct':>15}{'p90/direct':>12}{'paired':>8}{'90% interval':>14}{'failed':>8}")
        for mode, m in modes.items():
            add(f"{mode:<15}{m['n']:>4}{_f(m['median_ms'], '{:.1f}'):>11}{_f(m['p90_ms'], '{:.1f}'):>9}"
                f"{_f(m['mean_ms'], '{:.1f}'):>9}{_f(m['min_ms'], '{:.1f}'):>9}{_f(m['max_ms'], '{:.1f}'):>9}"
                f"{_x(m['median_ratio']):>15}{_x(m['p90_ratio']):>12}{_x(m['paired_median_ratio']):>8}"
                f"{_interval(m.get('paired_interval90') or (None, None)):>14}"
                f"{m['failures']:>8}")
        add("   (paired = median over iterations of mode/direct, the modes of an iteration running back to back;")
        add("    judged, as it cancels the machine's drift; 90% interval = bootstrap interval of that median)")
        drift = [f"{mode} {_f(m['direct_correlation'], '{:.2f}')}" for mode, m in modes.items()
                 if "direct_correlation" in m and mode != "direct"]
        if drift:
            add("   drift: correlation of each mode's lifecycle with direct's of the same iteration: "
                + ", ".join(drift))
        if "proxy+leanhook" in modes:
            add("   (proxy+hook = hooks answered by an SDK no-op server, hooks.testserver, on the SDK's frames")
            add("    transport and uvloop; proxy+leanhook = by bench/leanhook.py, the same answering at once with")
            add("    no task, decode or handler, cheaper per call as a compiled hook server is; the proxies are the same)")
        if CONTROL_MODE in modes:
            add(f"   ({CONTROL_MODE} = a second channel straight to containerd, an A/A control: its distance from")
            add("    1.00x is how far this run's lifecycle figures move by themselves)")
        if REFERENCE_MODES & modes.keys():
            add("   (reference relays, not the proxy: grpc-relay = a bare grpc.aio relay with no proxy code, the floor")
            add("    of the proxy's stack; byte-relay = a socket splice that never reads HTTP/2, the floor of any")
            add("    Python relay; see bench/relays.py)")
        add("   median per call (ms): direct's, and what each mode adds to it")
        others = [mode for mode in modes if mode != "direct"]
        add(f"   {'call':<18}{'direct':>{_STEP_COLUMN}}"
            + "".join(f"{'+' + mode:>{_STEP_COLUMN}}" for mode in others))
        for step in STEPS:
            base = modes["direct"]["step_median_ms"][step]
            diffs = [modes[mode]["step_median_ms"][step] - base for mode in others]
            add(f"   {step:<18}{_f(base, '{:.2f}'):>{_STEP_COLUMN}}"
                + "".join(f"{_f(d, '{:+.2f}'):>{_STEP_COLUMN}}" for d in diffs))

    rtt = results.get("hook_rtt") or results.get("hook_rtt_lean")
    if rtt:
        add("")
        add(f"3. Hook round trip: grpc.aio unary PreCreateContainerHook ({rtt['request_bytes']} byte "
            f"ContainerResourceHookRequest) to a no-op hook server, concurrency 1")
    for key, server in (("hook_rtt", "SDK"), ("hook_rtt_lean", "lean")):
        r = results.get(key)
        if r:
            add(f"   {server + ':':<6}calls {r['calls']}  p50 {_f(r['p50_ms'])} ms  p90 {_f(r['p90_ms'])} ms  "
                f"p99 {_f(r['p99_ms'])} ms  mean {_f(r['mean_ms'])} ms  ({_f(r['calls_per_s'], '{:.0f}')} calls/s)"
                f"  errors {r['errors']}")
    sparse = results.get("sparse")
    if sparse:
        add(f"   sparse, one call every {sparse['gap_ms']:g} ms as in a pod lifecycle (the processes sleep in "
            f"between; back-to-back rounds above do not show this):")
        for key, server in (("hook", "SDK"), ("lean hook", "lean")):
            hook = sparse.get(key)
            if hook:
                add(f"     hook round trip ({server}) p50 {_f(hook['p50_ms'])} ms  p90 {_f(hook['p90_ms'])} ms  "
                    f"({hook['calls']} calls)")
        direct, proxy = sparse.get("Version direct"), sparse.get("Version proxy")
        if direct and proxy:
            add(f"     Version direct p50 {_f(direct['p50_ms'])} ms, through the proxy {_f(proxy['p50_ms'])} ms "
                f"({_x(ratio(proxy['p50_ms'], direct['p50_ms']))}, +{_f(proxy['p50_ms'] - direct['p50_ms'])} ms)")
    for key, mode in (("proxy_metrics", "proxy+hook"), ("proxy_metrics_lean", "proxy+leanhook")):
        pm = (lcy or {}).get(key)
        if pm:
            _proxy_metrics(add, mode, pm)

    memory = results.get("memory") or {}
    if memory:
        add("")
        add("4. Proxy memory at the end of the run (after all of the above)")
        for name, m in memory.items():
            add(f"   {name:<15} RSS {m['rss_mib']:.1f} MiB  (peak {m['peak_mib']:.1f} MiB)")

    add("")
    add("Targets:")
    judged, figures, aa = verdicts(results), unjudged(results), control(results)
    shown_rows = figures + ([aa] if aa else [])
    width = max([10, *(len(row["shown"]) for row in judged + shown_rows)])
    label = max([40, *(len(v["target"]) for v in judged), *(len(u["figure"]) for u in shown_rows)])
    for v in judged:
        add(f"   {v['target']:<{label}} {v['shown']:>{width}}   {'PASS' if v['pass'] else 'FAIL'}")
    if aa:
        add("   the lifecycle measure's own spread in this run (an A/A control, not judged):")
        add(f"   {aa['figure']:<{label}} {aa['shown']:>{width}}")
    if figures:
        add("   no recorded baseline of today's figure, so not judged:")
        for u in figures:
            add(f"   {u['figure']:<{label}} {u['shown']:>{width}}")
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
    doc["unjudged"] = unjudged(results)
    doc["control"] = control(results)
    path.write_text(json.dumps(_clean(doc), indent=2, sort_keys=True) + "\n")
