"""The load generator's phases (bench/loadgen.py), on a fake call."""

from __future__ import annotations

from typing import Any

from bench.loadgen import LoadGen


async def test_a_gap_spaces_the_calls_and_is_not_counted_in_their_latency() -> None:
    async def call(request: Any, timeout: float) -> None:
        return None

    back_to_back = await LoadGen._phase(call, b"", 1, 0.2, 1.0)
    latencies, errors, _, _ = await LoadGen._phase(call, b"", 1, 0.2, 1.0, gap=0.05)
    assert errors == 0
    assert 1 <= len(latencies) <= 5 < len(back_to_back[0])  # at least 0.05 s between two calls' starts
    assert max(latencies) < 0.05e9  # nanoseconds: the call, not the pause after it
