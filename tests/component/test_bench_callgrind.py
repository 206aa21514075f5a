"""bench callgrind's set-up without valgrind (bench/cgdriver.py): the proxy behind the fake runtime,
with the SDK's hook server on every hook point, takes the bench's lifecycles and the calls one kind
at a time, and calls every hook point the lifecycle has."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench import cgdriver
from bench.lifecycle import STEPS
from bench.proxymetrics import HOOK_CALLS_PER_LIFECYCLE, fetch_metrics


async def _hook_calls(port: int, expected: int) -> dict[tuple[tuple[str, str], ...], float]:
    """The proxy's hook call counts once they reach ``expected`` (post hooks run after their call's answer)."""
    async with asyncio.timeout(20):
        while True:
            problems: list[str] = []
            calls = (await fetch_metrics(problems, port)).get("runtime_proxy_hook_calls_total", {})
            assert problems == []
            if sum(calls.values()) >= expected:
                return calls
            await asyncio.sleep(0.05)  # another process's counter: no event to await


async def test_the_lifecycles_and_the_calls_by_kind_reach_the_runtime_and_every_hook_point(sock_dir: Path) -> None:
    phases: list[str] = []

    async def settle() -> cgdriver.Phase:
        phases.append("settled")
        return cgdriver.Phase(0, 0)

    async with cgdriver.serving(sock_dir, lambda argv: argv) as s:
        await cgdriver.lifecycles(s, 2, "t")
        by_kind = await cgdriver.by_call(s, 2, settle)
        assert s.proxy.metrics_port is not None
        calls = await _hook_calls(s.proxy.metrics_port, 4 * HOOK_CALLS_PER_LIFECYCLE)
    assert list(by_kind) == list(STEPS) and len(phases) == len(STEPS)
    by_hook = {dict(labels)["hook"]: (dict(labels)["outcome"], count) for labels, count in calls.items()}
    assert by_hook == {hook: ("ok", 4.0) for hook in (
        "PreRunPodSandbox", "PreCreateContainer", "PreStartContainer", "PostStartContainer", "PostStopContainer",
        "PostStopPodSandbox")}
