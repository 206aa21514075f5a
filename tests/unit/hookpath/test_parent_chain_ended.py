"""A chain whose deferred answers (chaincpuset.py) are never judged: counted
as what ended it, the outage gate's refusal (cancelled, the CRI call's doing)
or a failure of the proxy's own (error, for an operator to see)."""

from __future__ import annotations

from pathlib import Path

import pytest

import grpc

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.admin import _how_they_failed

from .test_parent_chain import CREATE, FAIL, NOTHING, Run, pin


def _failing_build(run: Run, error: BaseException):  # type: ignore[no-untyped-def]
    builds = 0

    async def build() -> hookapi.ContainerResourceHookRequest:
        nonlocal builds
        builds += 1
        if builds == 2:  # before b is asked: a's answer is deferred
            raise error
        return hookapi.ContainerResourceHookRequest.FromString(run.request.SerializeToString())

    return build


async def test_a_proxy_failure_ending_the_chain_counts_its_deferred_answers_error(tmp_path: Path) -> None:
    """A build that raises (a proxy bug): a's deferred answer is counted
    ``error`` with the exception named (before: ``cancelled``, as if the CRI
    call had been, hiding the bug)."""
    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, NOTHING))
    with pytest.raises(KeyError):
        await run.dispatcher.run_pre(CREATE, _failing_build(run, KeyError("pod")), lambda answer, server: True,
                                     run.log_fields)
    assert (run.counted("a", "error"), run.counted("a", "cancelled"), run.counted("b", "error")) == (1, 0, 0)
    last = run.node.metrics.hook_stats["a.json"].last_error
    assert last is not None and last["cause"] == "the chain ended before it was judged: KeyError: 'pod'"
    # Guards existing behaviour: `error` is what `status` calls the proxy's
    # own failure, so the operator is not sent to a's process or answers.
    assert _how_they_failed(last["failed_by_outcome"]) == ": 1 failed in the proxy (error)"


async def test_the_gates_refusal_ending_the_chain_counts_its_deferred_answers_cancelled(tmp_path: Path) -> None:
    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, NOTHING))
    with pytest.raises(grpc.aio.AbortError):
        await run.dispatcher.run_pre(CREATE, _failing_build(run, grpc.aio.AbortError()), lambda answer, server: True,
                                     run.log_fields)
    assert (run.counted("a", "cancelled"), run.counted("a", "error")) == (1, 0)
    stats = run.node.metrics.hook_stats["a.json"]
    assert stats.calls == {"cancelled": 1} and stats.last_error is None
