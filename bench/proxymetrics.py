"""The hooked proxy's Prometheus metrics, as the benchmark reads and checks them."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from runtimeproxy.hookpath.points import HookType

from .stats import ratio

ALL_HOOKS = [h.value for h in HookType]
# Per lifecycle: PreRunPodSandbox, PreCreateContainer, PreStartContainer, PostStartContainer,
# PostStopContainer, PostStopPodSandbox (PreUpdateContainerResources has no call in a lifecycle).
HOOK_CALLS_PER_LIFECYCLE = 6

# metric name -> sorted label pairs -> value
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


async def fetch_metrics(problems: list[str], port: int) -> Samples:
    """Every sample on 127.0.0.1:<port>/metrics; empty (and a problem noted) if unreachable."""

    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return resp.read().decode()

    try:
        text = await asyncio.to_thread(fetch)
    except OSError as exc:
        problems.append(f"cannot fetch a hooked proxy's /metrics on 127.0.0.1:{port}: {exc}")
        return {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def hook_metrics(problems: list[str], before: Samples, after: Samples, hooked_lifecycles: int,
                 proxy: str = "proxy+hook") -> dict[str, Any]:
    """Hook calls made by the proxy (lifecycle mode ``proxy``) during the recorded lifecycles:
    count and mean per hook point."""

    def delta(name: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for labels, value in after.get(name, {}).items():
            out[dict(labels).get("hook") or dict(labels).get("method", "")] = (
                value - before.get(name, {}).get(labels, 0.0))
        return out

    sums, counts = delta("runtime_proxy_hook_duration_seconds_sum"), delta("runtime_proxy_hook_duration_seconds_count")
    per_hook = {h: {"count": int(counts.get(h, 0)),
                    "mean_ms": ratio(sums.get(h, 0.0) * 1000, counts.get(h, 0.0))} for h in ALL_HOOKS}
    total_count, total_sum = sum(counts.values()), sum(sums.values())
    outcomes: dict[str, float] = {}
    for labels, value in after.get("runtime_proxy_hook_calls_total", {}).items():
        outcome = dict(labels).get("outcome", "?")
        outcomes[outcome] = outcomes.get(outcome, 0.0) + value - before.get(
            "runtime_proxy_hook_calls_total", {}).get(labels, 0.0)
    hsums = delta("runtime_proxy_hooked_call_duration_seconds_sum")
    hcounts = delta("runtime_proxy_hooked_call_duration_seconds_count")
    hooked_calls = {m: {"count": int(hcounts[m]), "mean_ms": ratio(hsums.get(m, 0.0) * 1000, hcounts[m])}
                    for m in hcounts}
    bad = {k: v for k, v in outcomes.items() if k != "ok" and v}
    if bad:
        problems.append(f"{proxy}: the proxy's hook calls did not all succeed: {bad}")
    expected = hooked_lifecycles * HOOK_CALLS_PER_LIFECYCLE
    if total_count != expected:
        problems.append(f"{proxy}: the hooked proxy made {int(total_count)} hook calls during "
                        f"{hooked_lifecycles} recorded lifecycles, expected {expected}")
    return {"hook_calls": int(total_count), "hook_mean_ms": ratio(total_sum * 1000, total_count),
            "per_hook": per_hook, "outcomes": outcomes, "hooked_calls": hooked_calls}
