"""`status` says whether a hook server's last error is current or past: it kept
the last error after the server recovered, with no word that it had, and an
operator took a server that answered again for one still down."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

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
    assert (f"      now: recovered 0m12s ago, at {recovered}, after 3 failed calls in a row: 3 did not answer (unavailable)"
            in text.splitlines())
    assert "still failing" not in text


def test_answers_the_proxy_refused_count_in_the_run_and_are_told_from_calls_not_answered() -> None:
    """The server answered, but nothing it sent applied (under Fail, the CRI
    call was refused): a failure still, for an operator must not read the
    server as working; but its own words, for the fix is in its answers, not
    in its process or socket. Before: "still failing, 3 failed calls in a row"
    alike, as if it had not answered."""
    metrics = Metrics()
    metrics.hook_call("a.json", CREATE, "invalid_value", 0.01, "answer carries values the kernel would refuse")
    metrics.hook_call("a.json", CREATE, "invalid_answer", 0.01, "answer is not a valid ContainerResourceHookResponse")
    doc = status(metrics)
    error = doc["hook_servers"][0]["last_error"]
    assert (error["current"], error["failed_calls"]) == (True, 2)
    assert error["failed_by_outcome"] == {"invalid_value": 1, "invalid_answer": 1}
    line = render(doc, now=error["at"] + 5).splitlines()[-1]
    assert line.startswith("      now: still failing, 2 failed calls in a row since ")
    assert line.endswith(
        " (no call has succeeded since): 2 answered invalid values (invalid_value 1, invalid_answer 1)")

    metrics.hook_call("a.json", CREATE, "unavailable", 0.01, "UNAVAILABLE: connection refused")  # then it went down
    metrics.hook_call("a.json", CREATE, "ok", 0.01)
    doc = status(metrics)
    error = doc["hook_servers"][0]["last_error"]
    assert (error["current"], error["failed_calls"]) == (False, 3)
    line = render(doc, now=error["recovered_at"]).splitlines()[-1]
    assert line.endswith("after 3 failed calls in a row: 1 did not answer (unavailable), "
                         "2 answered invalid values (invalid_value 1, invalid_answer 1)")

    metrics.hook_call("a.json", CREATE, "deadline_exceeded", 1.0, "no answer within 1s")  # a new run: from naught
    assert status(metrics)["hook_servers"][0]["last_error"]["failed_by_outcome"] == {"deadline_exceeded": 1}


def test_a_run_says_which_calls_answered_an_error_and_which_were_never_made() -> None:
    """A server whose handler raised answered (``internal``, ``unknown``): its
    own log has why, its process and socket are fine; one whose socket the
    proxy does not trust was never called. Before: both read "failed to
    answer", sending the operator to the server's process or socket."""
    metrics = Metrics()
    metrics.hook_call("a.json", CREATE, "deadline_exceeded", 1.0, "no answer within 1s")
    metrics.hook_call("a.json", CREATE, "internal", 0.01, "INTERNAL: handler raised KeyError")
    metrics.hook_call("a.json", CREATE, "unknown", 0.01, "UNKNOWN: Exception calling application")
    metrics.hook_call("a.json", CREATE, "untrusted_endpoint", 0.0, "untrusted endpoint: socket /run/a.sock ...")
    doc = status(metrics)
    error = doc["hook_servers"][0]["last_error"]
    assert error["failed_calls"] == 4
    assert error["failed_by_outcome"] == {"deadline_exceeded": 1, "internal": 1, "unknown": 1, "untrusted_endpoint": 1}
    line = render(doc, now=error["at"] + 5).splitlines()[-1]
    assert line.endswith(
        " (no call has succeeded since): 1 did not answer (deadline_exceeded), "
        "2 answered an error (internal 1, unknown 1), 1 not called (untrusted_endpoint)")
    assert "answer (internal" not in line and "did not answer (untrusted" not in line


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
    # One older than `failed_by_outcome` sends its run's length alone: said as it was.
    doc["hook_servers"][0]["last_error"] = {**error, "current": True, "failing_since": error["at"], "failed_calls": 2}
    assert render(doc).splitlines()[-1] == (
        "      now: still failing, 2 failed calls in a row since 2023-11-14T22:13:20Z (no call has succeeded since)")


def test_a_call_its_caller_cancelled_neither_fails_nor_recovers_the_server() -> None:
    """kubelet giving up on a CRI call (or the proxy's stop) is no failure of
    the hook server's: it lengthened the run of failed calls, or started one
    for a server that never failed, and took the place of its last error."""
    metrics = Metrics()
    metrics.hook_call("a.json", CREATE, "cancelled", 0.5, "the CRI call was cancelled", caller_cancelled=True)
    assert metrics.hook_stats["a.json"].last_error is None  # never failed
    metrics.hook_call("a.json", CREATE, "unavailable", 0.01, "UNAVAILABLE: connection refused")
    metrics.hook_call("a.json", CREATE, "cancelled", 0.5, "the CRI call was cancelled", caller_cancelled=True)
    doc = status(metrics)
    server = doc["hook_servers"][0]
    assert server["calls"] == {"cancelled": 2, "unavailable": 1}  # each counted by its outcome still
    error = server["last_error"]
    assert (error["outcome"], error["current"], error["failed_calls"]) == ("unavailable", True, 1)
    lines = render(doc, now=error["at"] + 5).splitlines()
    assert lines[-1].startswith("      now: still failing, 1 failed call in a row since ")
    # the cancelled calls are in none of the run's kinds
    assert lines[-1].endswith(" (no call has succeeded since): 1 did not answer (unavailable)")
    # a hook call cancelled on its own (its connection closed) is the server's failure, as its outage counts it
    metrics.hook_call("a.json", CREATE, "cancelled", 0.01, "hook call cancelled (its connection was closed)")
    assert metrics.hook_stats["a.json"].last_error["failed_calls"] == 2  # type: ignore[index]


async def test_a_hook_call_cancelled_with_its_cri_call_leaves_the_last_error_as_it_was() -> None:
    """Through the dispatcher: the hook call kubelet's cancel cuts short is counted cancelled, no failure."""
    import asyncio

    import grpc

    from runtimeproxy.hookclient.transport import CallFailed
    from runtimeproxy.hookpath.dispatch import Dispatcher
    from runtimeproxy.hookpath.hookfile import FailurePolicy as Policy

    from .hookpath.dispatchfakes import Chain
    from .hookpath.test_dispatch import HOOK, Hanging, build, named

    class DownThenHanging(Hanging):
        async def call(
            self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
        ) -> bytes:
            if not self.called:
                self.called.append(endpoint)
                raise CallFailed(grpc.StatusCode.UNAVAILABLE, "connection refused")
            return await super().call(endpoint, method, request, timeout, owner_uid)

    metrics, transport = Metrics(), DownThenHanging()
    dispatcher = Dispatcher(Chain(named("a", Policy.IGNORE)), metrics, transport=transport)  # type: ignore[arg-type]
    await dispatcher.run_pre(HOOK, build, lambda answer, server: False, {})  # down: Ignore goes on
    chain = asyncio.ensure_future(dispatcher.run_pre(HOOK, build, lambda answer, server: False, {}))
    await transport.started.wait()
    chain.cancel()  # kubelet gives up on the CRI call
    with pytest.raises(asyncio.CancelledError):
        await chain
    stats = metrics.hook_stats["a.json"]
    assert stats.calls == {"unavailable": 1, "cancelled": 1}
    assert stats.last_error is not None
    assert (stats.last_error["outcome"], stats.last_error["failed_calls"]) == ("unavailable", 1)
    await dispatcher.close()
