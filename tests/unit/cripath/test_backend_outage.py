"""While the runtime is away the probe retries for ever: its log says so once,
then at most once a minute, then once when the runtime answers (as hook
server outages are logged), not a line per attempt."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runtimeproxy.cripath.backend import Backend, BackendInfo, BackendUnavailable
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.hookpath.outages import SUMMARY_INTERVAL

INFO = BackendInfo(frozenset({ApiVersion.V1}), "fake", "1")


async def probe_through(failures: int) -> tuple[Backend, float]:
    """Probe a backend that fails ``failures`` probes, then answers; each
    wait between probes moves the clock on instead of sleeping."""
    now = [0.0]
    backend = Backend(Path("/nonexistent.sock"), None, [], clock=lambda: now[0])
    left = [failures]

    async def probe_once() -> BackendInfo:
        if left[0]:
            left[0] -= 1
            raise BackendUnavailable(f"connection refused, {left[0]} to go")
        return INFO

    async def wait(seconds: float) -> None:
        now[0] += seconds

    backend.probe_once = probe_once  # type: ignore[method-assign]
    backend._sleep = wait
    assert await backend.probe() == INFO
    return backend, now[0]


async def test_an_outage_is_logged_when_it_starts_each_minute_and_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    _backend, took = await probe_through(40)  # waits of 0.1 s doubling to 5 s: about three minutes
    lines = [(r.levelno, r.getMessage().split(" after ")[0], r.__dict__) for r in caplog.records]
    lines = [line for line in lines if line[1] != "backend probed"]
    assert [(level, message) for level, message, _ in lines] == [
        (logging.WARNING, "backend not ready, retrying"),
        (logging.WARNING, "backend still not ready"),
        (logging.WARNING, "backend still not ready"),
        (logging.INFO, "backend ready again"),
    ]
    first, *summaries, ended = (fields for _, _, fields in lines)
    assert (first["backend_outage"], first["attempt"], first["error"]) == ("started", 1, "connection refused, 39 to go")
    seconds = [s["backend_outage_seconds"] for s in summaries]
    assert seconds[0] >= SUMMARY_INTERVAL and seconds[1] - seconds[0] >= SUMMARY_INTERVAL
    assert [s["backend_failures"] for s in summaries] == sorted(s["backend_failures"] for s in summaries)
    assert summaries[-1]["error"].startswith("connection refused")
    assert (ended["backend_outage"], ended["backend_failures"], ended["backend_outage_seconds"]) == ("ended", 40, round(took, 1))
    assert caplog.records[-2].getMessage() == f"backend ready again after {took:.1f}s and 40 failed probes"


async def test_a_backend_that_answers_at_once_logs_no_outage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    await probe_through(0)
    assert [r.getMessage() for r in caplog.records] == ["backend probed"]
