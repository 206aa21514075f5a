"""A Fail server's outage and its answer taken until the chain's end
(chaincpuset.py's deferral): the outage ends only once that answer is judged
and stands, never on the answer's arrival (an answer refused at the chain's
end would have logged "recovered" just before its call was refused)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import grpc

from runtimeproxy.hookclient.transport import CallFailed
from runtimeproxy.hookpath.dispatch import HookError

from .test_parent_chain import FAIL, ISO, NOTHING, Run, move, pin


class DownOnce:
    """The hook server is unreachable at its first call, up after."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls == 1:
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, "connection refused")


def recovered(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]


async def test_an_outage_goes_on_when_the_deferred_answer_is_refused_at_the_chains_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """b is down (its Fail refuses a call), then answers CPU 3, outside the
    pod's parent, and no later hook makes it fit: its answer is refused at the
    chain's end, so b has not recovered."""
    run = Run(tmp_path, ("b", FAIL, pin("3")), ("c", FAIL, NOTHING), first={"b": DownOnce()})
    caplog.set_level(logging.INFO, logger="runtimeproxy.hookpath.dispatch")
    with pytest.raises(HookError):  # b unreachable
        await run.run()
    with pytest.raises(HookError) as refused:  # b's answer, taken until the chain's end, stands refused
        await run.run()
    assert refused.value.server.name == "b.json"
    assert recovered(caplog) == []
    assert run.dispatcher._outages.down("b.json")


async def test_an_outage_ends_when_the_deferred_answer_stands_at_the_chains_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """As above, but c then moves the container where CPU 3 is: b's answer
    is taken, and only then is b's recovery logged, after the chain's end."""
    run = Run(tmp_path, ("b", FAIL, pin("3")), ("c", FAIL, move(ISO)), first={"b": DownOnce()})
    caplog.set_level(logging.INFO, logger="runtimeproxy.hookpath.dispatch")
    with pytest.raises(HookError):
        await run.run()
    assert await run.run() == (ISO, "3")
    assert [m.split(" after ")[0] for m in recovered(caplog)] == ["hook server b.json recovered"]
    assert not run.dispatcher._outages.down("b.json")
    assert (run.counted("b", "unavailable"), run.counted("b", "ok")) == (1, 1)
