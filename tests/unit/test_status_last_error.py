"""`status` says whether a hook server's last error is current or past: it kept
the last error after the server recovered, with no word that it had, and an
operator took a server that answered again for one still down."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runtimeproxy.admin import render
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookSnapshot, ReloadResult
from runtimeproxy.metrics import Metrics

from .test_admin_status import source

CREATE = HookType.PRE_CREATE_CONTAINER.value
SERVER = HookServerConfig("a.json", "/run/a.sock", FailurePolicy.FAIL, frozenset({HookType.PRE_CREATE_CONTAINER}))


def status(metrics: Metrics) -> dict[str, Any]:
    src = source(ReloadResult(), Path("/h"))
    src.registry.snapshot = HookSnapshot(servers={"a.json": SERVER})  # type: ignore[misc]
    object.__setattr__(src, "metrics", metrics)
    return src.document()


def test_a_failing_servers_last_error_is_current_with_its_run_of_failed_calls() -> None:
    metrics = Metrics()
    before = time.time()
    metrics.hook_call("a.json", CREATE, "ok", 0.01)
    metrics.hook_call("a.json", CREATE, "unavailable", 0.01, "UNAVAILABLE: connection refused")
    metrics.hook_call("a.json", CREATE, "deadline_exceeded", 1.0, "no answer within 1s")
    doc = status(metrics)
    error = doc["hook_servers"][0]["last_error"]
    assert (error["outcome"], error["cause"], error["current"]) == ("deadline_exceeded", "no answer within 1s", True)
    assert error["failed_calls"] == 2 and error["recovered_at"] is None
    assert before <= error["failing_since"] <= error["at"]
    lines = render(doc, now=error["at"] + 5).splitlines()
    at = lines.index(next(line for line in lines if line.startswith("    last error: deadline_exceeded")))
    assert lines[at + 1].startswith("      now: still failing, 2 failed calls in a row since ")


def test_a_recovered_servers_last_error_is_kept_and_said_to_be_past() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.hook_call("a.json", CREATE, "unavailable", 0.01, "UNAVAILABLE: connection refused")
    failed_at = metrics.hook_stats["a.json"].last_error["at"]  # type: ignore[index]
    metrics.hook_call("a.json", CREATE, "ok", 0.01)
    metrics.hook_call("a.json", CREATE, "ok", 0.01)  # a second success changes nothing of it
    doc = status(metrics)
    error = doc["hook_servers"][0]["last_error"]
    assert (error["outcome"], error["at"], error["cause"]) == ("unavailable", failed_at, "UNAVAILABLE: connection refused")
    assert (error["current"], error["failed_calls"]) == (False, 3)
    assert error["recovered_at"] >= failed_at
    text = render(doc, now=error["recovered_at"] + 12)
    recovered = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(error["recovered_at"]))
    assert f"      now: recovered 0m12s ago, at {recovered}, after 3 failed calls in a row" in text.splitlines()
    assert "still failing" not in text


def test_a_new_run_of_failures_counts_from_one_again() -> None:
    metrics = Metrics()
    metrics.hook_call("a.json", CREATE, "unavailable", 0.01, "x")
    metrics.hook_call("a.json", CREATE, "unavailable", 0.01, "x")
    metrics.hook_call("a.json", CREATE, "ok", 0.01)
    metrics.hook_call("a.json", CREATE, "internal", 0.01, "INTERNAL: y")
    error = status(metrics)["hook_servers"][0]["last_error"]
    assert (error["outcome"], error["current"], error["failed_calls"], error["recovered_at"]) == ("internal", True, 1, None)
    assert error["failing_since"] == error["at"]


def test_a_last_error_from_an_older_proxy_prints_as_before() -> None:
    """A proxy older than `current` sends none: its last error line stands alone."""
    doc = status(Metrics())
    error = {"outcome": "unavailable", "hook": CREATE, "at": 1_700_000_000.0, "cause": "c"}
    doc["hook_servers"][0]["last_error"] = error
    lines = render(doc).splitlines()
    assert lines[-1] == f"    last error: unavailable on {CREATE} at 2023-11-14T22:13:20Z: c"
