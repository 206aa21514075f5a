"""A separate image service's versions (cripath/imagewatch.py): its probe
finds them, and a service that comes back serving other versions is told to
the listeners (health follows it), not passed over as already up."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import ImageWatch, Probed
from runtimeproxy.cripath.methods import ApiVersion


class SteppedChannel:
    """Always READY; each wait for a change returns when the test says so."""

    def __init__(self) -> None:
        self.step = asyncio.Queue[None]()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY

    async def wait_for_state_change(self, state: grpc.ChannelConnectivity) -> None:
        await self.step.get()


async def test_a_service_serving_other_versions_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a service already up was not looked at again, so a restart
    into other versions left health on the old ones."""
    answers = [frozenset({ApiVersion.V1}), frozenset({ApiVersion.V1}), frozenset(ApiVersion)]

    async def probe(channel: Any, timeout: float) -> Probed:
        return Probed(None, answers.pop(0))

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    channel = SteppedChannel()
    watch = ImageWatch(Path("/run/img.sock"), channel)  # type: ignore[arg-type]
    told: list[tuple[bool, frozenset[ApiVersion] | None]] = []
    heard = asyncio.Event()

    def listener(up: bool) -> None:
        told.append((up, watch.versions))
        heard.set()

    watch.on_change(listener)
    running = asyncio.ensure_future(watch.run())
    try:
        await asyncio.wait_for(heard.wait(), 5)
        heard.clear()
        channel.step.put_nowait(None)  # the same versions: nothing to tell
        channel.step.put_nowait(None)  # both versions now
        await asyncio.wait_for(heard.wait(), 5)
        assert told == [(True, frozenset({ApiVersion.V1})), (True, frozenset(ApiVersion))]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_version_dropped_while_up_is_a_warning_and_a_lack_is_warned_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A version that leaves while up is a WARNING (its image calls now fail),
    with the set it was and the one it is; image calls sent in it are warned
    of, once for the same plan and versions (a plan rebuilt alike says nothing
    again). Before: INFO "serves other CRI versions", no previous set, and no
    warning that the version image calls are sent in was gone."""
    caplog.set_level(logging.INFO, logger=imagewatch.__name__)
    answers = [frozenset(ApiVersion), frozenset({ApiVersion.V1})]

    async def probe(channel: Any, timeout: float) -> Probed:
        return Probed(None, answers.pop(0))

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    channel = SteppedChannel()
    watch = ImageWatch(Path("/run/img.sock"), channel)  # type: ignore[arg-type]
    watch.sent_in(frozenset({ApiVersion.V1ALPHA2}))
    heard = asyncio.Event()
    watch.on_change(lambda up: heard.set())
    running = asyncio.ensure_future(watch.run())
    try:
        await asyncio.wait_for(heard.wait(), 5)
        heard.clear()
        channel.step.put_nowait(None)  # v1alpha2 gone
        await asyncio.wait_for(heard.wait(), 5)
        watch.sent_in(frozenset({ApiVersion.V1ALPHA2}))  # the plan rebuilt alike: no second warning
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert (watch.lacking, watch.usable) == (frozenset({ApiVersion.V1ALPHA2}), False)
    told = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [(r.levelno, r.getMessage()) for r in told] == [
        (logging.INFO, "image backend connected"),
        (logging.WARNING, "image backend serves other CRI versions"),
        (logging.WARNING, "image backend lacks a CRI version image calls are sent in: they fail there"),
    ]
    assert (told[1].was, told[1].versions) == (["v1", "v1alpha2"], ["v1"])  # type: ignore[attr-defined]
    assert told[2].lacking == ["v1alpha2"]  # type: ignore[attr-defined]


async def _up(watch: ImageWatch, channel: SteppedChannel, steps: int = 0) -> None:
    """``watch`` run until it has told its listeners ``steps + 1`` times."""
    heard = asyncio.Event()
    watch.on_change(lambda up: heard.set())
    running = asyncio.ensure_future(watch.run())
    try:
        for step in range(steps + 1):
            await asyncio.wait_for(heard.wait(), 5)
            heard.clear()
            if step < steps:
                channel.step.put_nowait(None)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_lack_told_at_a_later_plan_says_the_version_timed_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The service probed up in v1, v1alpha2 timing out, before the runtime's
    plan exists; the plan, sending image calls in v1alpha2, comes after: its
    "lacks" warning carries that probe's version_problem (before: none, so a
    timeout read as an absence)."""
    caplog.set_level(logging.INFO, logger=imagewatch.__name__)
    timed_out = "ImageFsInfo (v1alpha2): DEADLINE_EXCEEDED: Deadline Exceeded"

    async def probe(channel: Any, timeout: float) -> Probed:
        return Probed(None, frozenset({ApiVersion.V1}), failed=timed_out, failing=frozenset({ApiVersion.V1ALPHA2}))

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    channel = SteppedChannel()
    watch = ImageWatch(Path("/run/img.sock"), channel)  # type: ignore[arg-type]
    await _up(watch, channel)
    watch.sent_in(frozenset({ApiVersion.V1ALPHA2}))
    [lacks] = [r for r in caplog.records if r.getMessage().startswith("image backend lacks")]
    assert lacks.version_problem == timed_out  # type: ignore[attr-defined]


async def test_a_version_gone_that_no_image_call_is_sent_in_is_news(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """v1alpha2 leaving while image calls are sent in v1 alone fails none of
    them: "serves other CRI versions" is INFO (before: a WARNING for any
    version gone)."""
    caplog.set_level(logging.INFO, logger=imagewatch.__name__)
    answers = [frozenset(ApiVersion), frozenset({ApiVersion.V1})]

    async def probe(channel: Any, timeout: float) -> Probed:
        return Probed(None, answers.pop(0))

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    channel = SteppedChannel()
    watch = ImageWatch(Path("/run/img.sock"), channel)  # type: ignore[arg-type]
    watch.sent_in(frozenset({ApiVersion.V1}))
    await _up(watch, channel, steps=1)
    [other] = [r for r in caplog.records if r.getMessage() == "image backend serves other CRI versions"]
    assert other.levelno == logging.INFO and other.was == ["v1", "v1alpha2"]  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(("failed", "failing"), [
    ("ImageFsInfo (v1alpha2): UNAVAILABLE: x", frozenset()),
    (None, frozenset({ApiVersion.V1ALPHA2})),
])
def test_a_probe_outcome_names_its_failing_versions_with_its_failure(
        failed: str | None, failing: frozenset[ApiVersion]) -> None:
    """``failed`` and ``failing`` come together, as image_probe sets them,
    so the backoff's cap never meets failing versions not known (before: a
    hand-built outcome could, and the cap took them as sent in)."""
    with pytest.raises(ValueError, match="must come together"):
        Probed(None, frozenset({ApiVersion.V1}), failed=failed, failing=failing)
