"""A separate image service's re-probes (cripath/imagewatch.py): how long the
watch waits between probes of a service that does not serve, or serves with
a version failing, and what it logs meanwhile. The probe is a script, the
waits a fake clock's: each wait is recorded and over at once.

A2_FAILING (v1 serving, v1alpha2 failing) is no longer what containerd
gives: its registered v1alpha2 is taken as served without a call of its
own (imageprobe.py), however slow v1's answer. Servers whose answer to
the method that does not exist does not tell (grpc-python's, one that
answers any method) still give it;
test_image_watch_real_probe.py runs the real probe in the watch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import RETRY_FIRST, RETRY_MAX, VERSION_RETRY_MAX, ImageWatch, Probed
from runtimeproxy.cripath.methods import ApiVersion

from tests.fakeclock import Clock

V1, A2 = ApiVersion.V1, ApiVersion.V1ALPHA2
_S = grpc.ChannelConnectivity
TIMED_OUT = "ImageFsInfo (v1alpha2): DEADLINE_EXCEEDED: Deadline Exceeded"
A2_FAILING = Probed(None, frozenset({V1}), failed=TIMED_OUT, failing=frozenset({A2}))
BOTH = Probed(None, frozenset({V1, A2}))
DOWN = Probed("ImageFsInfo (v1, v1alpha2): UNAVAILABLE: gone")


def doubling(count: int, cap: float) -> list[float]:
    """The first ``count`` waits of a backoff from RETRY_FIRST up to ``cap``."""
    return [min(RETRY_FIRST * 2 ** i, cap) for i in range(count)]


class Channel:
    """READY unless ``states`` says otherwise (one state a look); a wait for
    a change from READY ends only when ``step`` is given one, from another
    state at once (the next look reconnects)."""

    def __init__(self, states: list[grpc.ChannelConnectivity] | None = None) -> None:
        self.states = states or []
        self.step = asyncio.Queue[None]()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.states.pop(0) if self.states else _S.READY

    async def wait_for_state_change(self, state: grpc.ChannelConnectivity) -> None:
        if state is _S.READY:
            await self.step.get()


@asynccontextmanager
async def running(
    monkeypatch: pytest.MonkeyPatch, answers: Iterator[Probed], clock: Clock, channel: Channel | None = None,
    targets: frozenset[ApiVersion] | None = None, replans: dict[int, frozenset[ApiVersion]] | None = None,
) -> AsyncIterator[tuple[ImageWatch, list[Probed]]]:
    """The watch running, and the probes' answers so far. A probe that
    finds the service serving in full steps the channel (a reconnect), else
    nothing would probe again; the probe numbered a key of ``replans``
    (from 0) sees the plan change to its value while it is under way."""
    channel = channel or Channel()
    probed: list[Probed] = []

    async def probe(_channel: Any, timeout: float) -> Probed:
        answer = next(answers, None)
        if answer is None:
            clock.over.set()
            await asyncio.Event().wait()
        assert answer is not None
        if len(probed) in (replans or {}):
            watch.sent_in((replans or {})[len(probed)])
        probed.append(answer)
        if answer.reason is None and answer.failed is None:
            channel.step.put_nowait(None)
        return answer

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    watch = ImageWatch(Path("/run/img.sock"), channel, sleep=clock.sleep)
    watch.sent_in(targets)
    task = asyncio.ensure_future(watch.run())
    try:
        yield watch, probed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def watched(monkeypatch: pytest.MonkeyPatch, answers: Iterator[Probed], clock: Clock,
                  channel: Channel | None = None, targets: frozenset[ApiVersion] | None = None,
                  replans: dict[int, frozenset[ApiVersion]] | None = None) -> list[Probed]:
    """The watch run until ``answers`` or the clock runs out; the probes' answers."""
    async with running(monkeypatch, answers, clock, channel, targets, replans) as (_, probed):
        await asyncio.wait_for(clock.over.wait(), 10)
    return probed


def forever(answer: Probed) -> Iterator[Probed]:
    while True:
        yield answer


async def test_a_version_failing_for_good_is_probed_less_and_less(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """v1 serves, v1alpha2 times out at every probe, image calls go in v1:
    the waits double up to VERSION_RETRY_MAX and stay there, 69 probes in an
    hour, and the log says it once, as the service connects. Before: every
    RETRY_MAX (5 s) for good, 720 probes an hour."""
    caplog.set_level(logging.DEBUG, logger=imagewatch.__name__)
    clock = Clock(until=3600.0)
    probed = await watched(monkeypatch, forever(A2_FAILING), clock, targets=frozenset({V1}))
    ramp = doubling(11, VERSION_RETRY_MAX)  # 0.1 ... 51.2, then 60
    assert clock.waits == pytest.approx(ramp + [VERSION_RETRY_MAX] * (len(clock.waits) - len(ramp)))
    assert len(probed) == len(clock.waits) == 69
    assert [r.getMessage() for r in caplog.records] == ["image backend connected"]
    assert caplog.records[0].version_problem == TIMED_OUT  # type: ignore[attr-defined]


@pytest.mark.parametrize("targets", [frozenset({A2}), None], ids=["sent-in-it", "no-plan-yet"])
async def test_a_failing_version_image_calls_are_sent_in_is_probed_as_an_outage(
    monkeypatch: pytest.MonkeyPatch, targets: frozenset[ApiVersion] | None
) -> None:
    """Guards existing behaviour: a failing version that image calls are sent
    in (or may be: no plan yet) fails them as an outage would, so its return
    is looked for as often as a service down's, at most RETRY_MAX apart."""
    clock = Clock(until=600.0)
    await watched(monkeypatch, forever(A2_FAILING), clock, targets=targets)
    assert max(clock.waits) == RETRY_MAX
    assert clock.waits[:8] == pytest.approx(doubling(8, RETRY_MAX))


async def test_the_backoff_starts_afresh_at_a_recovery_and_a_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each change of the service's state starts the waits from RETRY_FIRST
    again, under the cap of the new state: v1alpha2 failing long enough to
    reach VERSION_RETRY_MAX, then served (no wait), failing again, the
    service down (capped at RETRY_MAX), then up with v1alpha2 failing.
    Before: the waits went on from where they were (a loss after a
    minute-long wait was probed again after it), and topped at 5 s."""
    answers = [A2_FAILING] * 12 + [BOTH] + [A2_FAILING] * 3 + [DOWN] * 8 + [A2_FAILING] * 2
    clock = Clock()
    probed = await watched(monkeypatch, iter(answers), clock, targets=frozenset({V1}))
    assert probed == answers
    assert clock.waits == pytest.approx(
        doubling(12, VERSION_RETRY_MAX) + doubling(3, VERSION_RETRY_MAX) + doubling(8, RETRY_MAX)
        + doubling(2, VERSION_RETRY_MAX))


async def test_a_new_connection_starts_the_backoff_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The channel leaving READY (here IDLE, then reconnected): the service
    behind the new connection may be another, its first failure is waited
    on from RETRY_FIRST. Before: only a failed connection attempt did so."""
    channel = Channel([_S.READY] * 8 + [_S.IDLE])
    clock = Clock()
    await watched(monkeypatch, iter([A2_FAILING] * 11), clock, channel, targets=frozenset({V1}))
    assert clock.waits == pytest.approx(doubling(8, VERSION_RETRY_MAX) + doubling(3, VERSION_RETRY_MAX))


async def test_a_service_down_for_long_logs_its_changes_not_each_probe(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Down for 20 probes for one reason, then for another: the loss, then a
    debug line for the new reason, not one a probe (before: "still not
    serving" at each, every RETRY_MAX for as long as it is down); the end
    line still counts every failed probe."""
    caplog.set_level(logging.DEBUG, logger=imagewatch.__name__)
    other = Probed("ImageFsInfo (v1, v1alpha2): UNAVAILABLE: not initialized yet")
    await watched(monkeypatch, iter([DOWN] * 20 + [other] * 3 + [BOTH]), Clock())
    assert [(r.levelno, r.msg) for r in caplog.records] == [
        (logging.WARNING, "image backend not reachable yet"),
        (logging.DEBUG, "image backend still not serving"),
        (logging.INFO, "image backend ready after %.1fs (%d failures)"),
    ]
    assert caplog.records[1].reason == other.reason  # type: ignore[attr-defined]
    assert caplog.records[2].image_backend_failures == 23  # type: ignore[attr-defined]


async def test_a_plan_change_wakes_a_long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Image calls in v1, v1alpha2 failing: the watch reaches a
    VERSION_RETRY_MAX wait; the plan then sends image calls in v1alpha2,
    whose failure now fails them: it is probed again at once, and waited on
    at most RETRY_MAX. Before: the minute's wait ran out first."""
    clock = Clock(until=250.0)  # the waits end at once up to the first 60 s one (0.1 ... 51.2 is 204.7 s)
    async with running(monkeypatch, forever(A2_FAILING), clock, targets=frozenset({V1})) as (watch, probed):
        await asyncio.wait_for(clock.over.wait(), 10)
        assert clock.waits[-1] == VERSION_RETRY_MAX
        count, now = len(probed), clock.now
        clock.over.clear()
        watch.sent_in(frozenset({A2}))
        await asyncio.wait_for(clock.over.wait(), 5)  # the next wait begun: after one probe, at the same time
        assert (len(probed), clock.now - clock.waits[-1]) == (count + 1, now)
        assert clock.waits[-1] == RETRY_MAX


async def test_the_cap_is_the_plan_s_at_each_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards existing behaviour: no plan yet (v1alpha2 failing may fail
    image calls), the waits stop at RETRY_MAX; a plan sending image calls in
    v1 comes during the 11th probe: from it on they double on up to
    VERSION_RETRY_MAX."""
    clock = Clock(until=600.0)
    await watched(monkeypatch, forever(A2_FAILING), clock, replans={10: frozenset({V1})})
    assert clock.waits[:16] == pytest.approx(doubling(10, RETRY_MAX) + [5.0, 10.0, 20.0, 40.0, 60.0, 60.0])


async def test_other_versions_failing_start_the_backoff_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards existing behaviour: v1 serving and v1alpha2 failing (image
    calls in v1: up to VERSION_RETRY_MAX), then the service restarted
    serving v1alpha2 with v1 failing (image calls' version: up to
    RETRY_MAX): the waits start again from RETRY_FIRST, not at the cap."""
    a1_failing = Probed(None, frozenset({A2}), failed="ImageFsInfo (v1): UNAVAILABLE: x", failing=frozenset({V1}))
    clock = Clock()
    await watched(monkeypatch, iter([A2_FAILING] * 12 + [a1_failing] * 8), clock, targets=frozenset({V1}))
    assert clock.waits == pytest.approx(doubling(12, VERSION_RETRY_MAX) + doubling(8, RETRY_MAX))
