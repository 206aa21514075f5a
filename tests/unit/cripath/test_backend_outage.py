"""While the runtime is away the probe retries for ever: its log says so when
it is lost, then at a failed probe at most once a minute, then once when the
runtime answers (as hook server outages are logged), not a line per attempt."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runtimeproxy.cripath.backend import Backend, BackendInfo, BackendUnavailable
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.logs import TextFormatter
from runtimeproxy.outages import SUMMARY_INTERVAL

INFO = BackendInfo(frozenset({ApiVersion.V1}), "fake", "1")


class Runtime:
    """A backend whose probes fail ``failures`` times, then answer; each
    wait between probes moves the clock on instead of sleeping."""

    def __init__(self) -> None:
        self.now = 0.0
        self.failures = 0
        self.backend = Backend(Path("/nonexistent.sock"), None, [], clock=lambda: self.now)

        async def probe_once() -> BackendInfo:
            if self.failures:
                self.failures -= 1
                raise BackendUnavailable(f"connection refused, {self.failures} to go")
            return INFO

        async def wait(seconds: float) -> None:
            self.now += seconds

        self.backend.probe_once = probe_once  # type: ignore[method-assign]
        self.backend._sleep = wait


async def probe_through(failures: int) -> tuple[Backend, float]:
    """Probe a backend that fails ``failures`` probes, then answers."""
    runtime = Runtime()
    runtime.failures = failures
    assert await runtime.backend.probe() == INFO
    return runtime.backend, runtime.now


async def test_an_outage_is_logged_when_it_starts_each_minute_and_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    _backend, took = await probe_through(40)  # waits of 0.1 s doubling to 5 s: about three minutes
    lines = [(r.levelno, r.getMessage().split(" after ")[0], r.__dict__) for r in caplog.records]
    lines = [line for line in lines if line[1] != "backend probed"]
    assert [(level, message) for level, message, _ in lines] == [
        (logging.WARNING, "backend not ready, retrying"),
        (logging.WARNING, "backend still not ready"),
        (logging.WARNING, "backend still not ready"),
        (logging.INFO, "backend ready"),
    ]
    first, *summaries, ended = (fields for _, _, fields in lines)
    assert (first["backend_outage"], first["attempt"], first["error"]) == ("started", 1, "connection refused, 39 to go")
    seconds = [s["backend_outage_seconds"] for s in summaries]
    assert seconds[0] >= SUMMARY_INTERVAL and seconds[1] - seconds[0] >= SUMMARY_INTERVAL
    assert [s["backend_failures"] for s in summaries] == sorted(s["backend_failures"] for s in summaries)
    assert summaries[-1]["error"].startswith("connection refused")
    assert (ended["backend_outage"], ended["backend_failures"], ended["backend_outage_seconds"]) == ("ended", 40, round(took, 1))
    # at boot: never ready before, so not "again"
    assert caplog.records[-2].getMessage() == f"backend ready after {took:.1f}s (40 failed probes)"


async def test_the_outage_lines_keep_their_fields_in_order(caplog: pytest.LogCaptureFixture) -> None:
    """A text line prints its fields in the order logged: the error after a
    first line's attempt and wait, and after a summary's counts (as they were
    when the backend had an outage log of its own)."""
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    await probe_through(40)
    lines = [TextFormatter().format(r).split(" ", 1)[1] for r in caplog.records if r.getMessage() != "backend probed"]
    assert lines[:2] == [
        "warning runtimeproxy.cripath.backend 'backend not ready, retrying' backend=/nonexistent.sock"
        ' attempt=1 retry_in_s=0.1 error="connection refused, 39 to go" backend_outage=started',
        "warning runtimeproxy.cripath.backend 'backend still not ready' backend=/nonexistent.sock"
        ' backend_outage=ongoing backend_failures=18 backend_outage_seconds=61.3 error="connection refused, 22 to go"',
    ]
    assert lines[-1] == (
        "info runtimeproxy.cripath.backend 'backend ready after 176.3s (40 failed probes)' backend=/nonexistent.sock"
        " backend_outage=ended backend_failures=40 backend_outage_seconds=176.3"
    )


async def test_a_backend_that_answers_at_once_logs_no_outage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    await probe_through(0)
    assert [r.getMessage() for r in caplog.records] == ["backend probed"]


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage() != "backend probed"]


async def test_boot_with_the_runtime_absent_then_present_says_ready_not_ready_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    runtime = Runtime()
    runtime.failures = 3  # waits of 0.1, 0.2, 0.4 s
    await runtime.backend.probe()
    assert outage_lines(caplog) == ["backend not ready, retrying", "backend ready after 0.7s (3 failed probes)"]
    assert caplog.records[-2].backend_outage_seconds == 0.7


async def test_each_outage_of_a_ready_backend_ends_with_ready_again_and_its_length(caplog: pytest.LogCaptureFixture) -> None:
    """containerd stops (the channel fails), comes back (the channel is READY
    again): the first probe after it succeeds, and the line says how long the
    runtime was away, from when it was lost; twice."""
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    runtime = Runtime()
    await runtime.backend.probe()
    for away in (42.0, 7.5):
        caplog.clear()
        runtime.backend._lost("connection failed")
        runtime.now += away
        await runtime.backend._reconnected()  # a new socket file? the same here: probed as _same_runtime says no
        assert outage_lines(caplog) == [
            "backend unavailable",
            "backend connection re-established, probing again",
            f"backend ready again after {away:.1f}s (0 failed probes)",
        ]
        started = next(r for r in caplog.records if r.getMessage() == "backend unavailable")
        ended = next(r for r in caplog.records if r.getMessage().startswith("backend ready again"))
        assert started.backend_outage == "started"  # the pair's first line, though no probe failed
        assert (ended.backend_outage, ended.backend_failures, ended.backend_outage_seconds) == ("ended", 0, away)


async def test_an_outage_with_failed_probes_counts_them_from_when_the_backend_was_lost(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    runtime = Runtime()
    await runtime.backend.probe()
    caplog.clear()
    runtime.backend._lost("connection failed")
    runtime.now += 10.0
    runtime.failures = 2  # back, its CRI plugin not ready yet: waits of 0.1 and 0.2 s
    await runtime.backend._reconnected()
    assert outage_lines(caplog) == [
        "backend unavailable",
        "backend connection re-established, probing again",
        "backend not ready, retrying",
        "backend ready again after 10.3s (2 failed probes)",
    ]
    outage = [getattr(r, "backend_outage", None) for r in caplog.records if r.getMessage() != "backend probed"]
    assert outage == ["started", None, "ongoing", "ended"]  # one outage, started at the loss


@pytest.fixture
def same_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's socket file stays the one it was (no restart seen)."""
    monkeypatch.setattr("runtimeproxy.cripath.backend.runtime_instance", lambda path: (1, 2, 3))


async def test_an_idle_reconnect_to_the_same_runtime_logs_no_outage(caplog: pytest.LogCaptureFixture, same_socket: None) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    runtime = Runtime()
    await runtime.backend.probe()
    caplog.clear()
    await runtime.backend._reconnected()  # grpc's idle timeout closed the connection; it came back
    assert outage_lines(caplog) == [] and runtime.backend.connected


async def test_a_failed_quiet_probe_after_a_reconnect_is_a_failed_probe_of_the_outage(
    caplog: pytest.LogCaptureFixture, same_socket: None
) -> None:
    caplog.set_level(logging.INFO, logger="runtimeproxy.cripath.backend")
    runtime = Runtime()
    await runtime.backend.probe()
    caplog.clear()
    runtime.failures = 1  # the quiet probe of _same_runtime; the re-probe answers
    await runtime.backend._reconnected()
    assert outage_lines(caplog) == [
        "backend unavailable",
        "backend connection re-established, probing again",
        "backend ready again after 0.0s (1 failed probes)",
    ]
    assert caplog.records[0].reason == "probe failed" and caplog.records[0].backend_outage == "started"
