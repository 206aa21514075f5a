"""An image service on a socket of its own (``--image-backend``): whether it
serves, and its outages.

The runtime is probed (backend.py); a separate image service serves only the
image calls (kubelet's pulls, its image garbage collection), which fail
UNAVAILABLE while it is away. Health and the metrics saying nothing of it
would tell an operator all is well while no pod whose image is missing can
start.

It is judged by its channel, kept connected as the runtime's is (each look
asks grpc to connect), and by a probe at each READY (imageprobe.py: which
versions answer ImageFsInfo, and whether the service serves). A connection
alone says too little: a socket whose process takes the connection may not
serve (containerd's "not initialized yet" while it loads its state; a hung
service). A probe that finds it down, or a version failing, is asked
again after a backoff (``_Backoff``): from RETRY_FIRST, doubling,
up to RETRY_MAX (the runtime probe's ceiling) while the service is down or
the failing version is one image calls are sent in, up to VERSION_RETRY_MAX
while it serves and only a version no image call is sent in fails (a
probe a minute, not every 5 s for the life of the proxy: a v1alpha2 that
errors for good, on a server whose answer to the method that does not
exist does not tell, with image calls in v1; or a v1 failing with image
calls in v1alpha2 only. On grpc-go, containerd, a registered v1alpha2 is
taken as served and not probed for a failure of its own); a change of the
plan ends the wait (the cap may fall). The backoff starts afresh at each change of
the service's state: up or down, the versions found, the channel leaving
READY (a new connection), the watch's restart. Only changes are logged, not
each probe. Health says NOT_SERVING for a
served CRI version whose image calls would reach it in a version it lacks
(server.py), as for a version the runtime lacks; one that has none of the
versions image calls are sent in (``targets``, the plan's) is not ``usable``:
the overall health and the ready metric say so too, and a lack is warned of.
TRANSIENT_FAILURE (a connection attempt failed: nothing listens, or the
socket is gone) is down too. IDLE and CONNECTING decide nothing: grpc's idle
timeout closes an unused connection, and the next look reconnects it (its
READY is probed, and a service still up stays up without a line).

An outage's end line counts its failures: each failed probe, and each
connection attempt seen failing (pick_first keeps TRANSIENT_FAILURE through
its reconnect attempts, unreachable.py, so several failed attempts in a row
count once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from ..outages import IMAGE_BACKEND, SUMMARY_INTERVAL, OutageLog
from ..supervisor import Restart
from .backend import PROBE_TIMEOUT
from .imageprobe import Probed, image_probe
from .methods import ApiVersion

log = logging.getLogger(__name__)

_S = grpc.ChannelConnectivity
RETRY_FIRST = 0.1  # seconds before a failed probe is asked again, doubling
# Down, or failing a version image calls are sent in: as the runtime's
# probe's default longest interval, its return is what pulls wait on.
RETRY_MAX = 5.0
# Serving, a version no image call is sent in failing (a v1alpha2 failing
# on a server that does not tell it is registered, imageprobe.py; a v1 with
# image calls in v1alpha2 only): its return changes no call's fate nor
# health, only the versions status shows; the outage summaries' interval
# (a minute) keeps a version failing for good to a probe a minute while
# still noticing a fixed one within one.
VERSION_RETRY_MAX = SUMMARY_INTERVAL
# The proxy serves the runtime's calls without the image service: a watch
# that keeps dying is restarted (each time logged), never the proxy stopped.
RESTART = Restart(first_delay=0.1, max_delay=30.0, attempts=None)


@dataclass
class _Backoff:
    """The wait before the next probe of a service that does not serve, or
    serves with a version failing: doubling while what the probes find
    stays the same (``seen``), from RETRY_FIRST again at a change."""

    delay: float = RETRY_FIRST
    seen: tuple[object, ...] | None = None  # what the last probe found: up, versions (None: nothing since a reset)

    def reset(self) -> None:
        self.delay, self.seen = RETRY_FIRST, None

    def next(self, seen: tuple[object, ...], cap: float) -> float:
        """The wait after a probe that found ``seen``, at most ``cap``."""
        if seen != self.seen:
            self.delay, self.seen = RETRY_FIRST, seen
        wait = min(self.delay, cap)
        self.delay = min(wait * 2, cap)
        return wait


def _named(versions: frozenset[ApiVersion], unknown: frozenset[ApiVersion]) -> list[str]:
    """The versions for the log: an assumed one says so ("v1alpha2 (unknown)")."""
    return [f"{v} (unknown)" if v in unknown else str(v) for v in sorted(versions)]


class ImageWatch:
    """The separate image service's state: ``up``, and its listeners told
    True when it comes (back), and again while up when its versions change;
    False when it is lost."""

    def __init__(
        self, socket: Path, channel: aio.Channel, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.socket = socket
        self._channel = channel
        self._sleep = sleep  # the backoff's wait (tests: a fake clock's)
        self.up = False  # serving now: its last probe answered, no failed attempt since
        self.reason: str | None = None  # why it does not serve, the latest seen (None while it serves)
        self.lost_reason: str | None = None  # why it was lost, at the loss (None while it serves)
        self.versions: frozenset[ApiVersion] | None = None  # the CRI versions its last answering probe found
        self.unknown: frozenset[ApiVersion] = frozenset()  # of those, the ones assumed (their answer said nothing)
        self._was_up = False  # serving at some time since start (its end line says "again")
        self._outages = OutageLog(log, IMAGE_BACKEND, clock=clock)
        self._listeners: list[Callable[[bool], None]] = []
        self._retry = _Backoff()  # the wait before the next probe of a READY service down, or with a version failed
        self.targets: frozenset[ApiVersion] | None = None  # the versions image calls are sent in (None: no plan)
        self._lack_told: tuple[object, ...] | None = None  # what the last "lacks" warning said (not said twice)
        # Why the versions its last answering probe left out failed (None: each
        # answered or was absent): a "lacks" warning told later, at a plan
        # change, still says a timeout rather than an absence.
        self.version_problem: str | None = None
        # Set by a change of ``targets``: it may change the backoff's cap
        # (``_cap``), so a wait reached under the old plan ends at once.
        self._replanned = asyncio.Event()
        # The one wait for the channel to leave a state, kept across pauses:
        # grpc aio keeps a cancelled wait (and its future) until the state
        # changes, so one a pause would pile up while the channel stays READY.
        self._change: tuple[grpc.ChannelConnectivity, asyncio.Future[None]] | None = None

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """Called with True when the image service comes (back) and when, up,
        it is found serving other versions; False when it is lost."""
        self._listeners.append(listener)

    def sent_in(self, targets: frozenset[ApiVersion] | None) -> None:
        """The CRI versions the proxy sends image calls in (the routing plan's
        targets; None: no plan), told at each plan rebuild."""
        if targets != self.targets:
            self._replanned.set()
        self.targets = targets
        self._warn_lacking()

    @property
    def lacking(self) -> frozenset[ApiVersion]:
        """The versions image calls are sent in that the service, up, was not
        found serving: those calls fail there."""
        if not self.up or self.versions is None or self.targets is None:
            return frozenset()
        return self.targets - self.versions

    @property
    def usable(self) -> bool:
        """Up, and serving at least one version image calls are sent in: one
        that serves none of them answers every image call UNIMPLEMENTED."""
        return self.up and (self.targets is None or self.versions is None or bool(self.targets & self.versions))

    def _warn_lacking(self) -> None:
        """A WARNING when the service, up, lacks a version image calls are
        sent in, at a change of its versions or of the plan (not at each
        probe that finds the same)."""
        lacking = self.lacking
        told = (lacking, self.versions, self.targets) if lacking else None
        if told is None or told == self._lack_told:
            self._lack_told = told
            return
        self._lack_told = told
        fields: dict[str, object] = {
            "backend": str(self.socket), "lacking": sorted(str(v) for v in lacking),
            "versions": _named(self.versions or frozenset(), self.unknown), "usable": self.usable}
        if self.version_problem is not None:
            fields["version_problem"] = self.version_problem
        log.warning("image backend lacks a CRI version image calls are sent in: they fail there", extra=fields)

    async def run(self) -> None:
        """Look at each state the channel comes to, until cancelled (the
        proxy's stop, before the channel closes: supervisor.STOP_ORDER).
        If it fails, the image service is taken for down until its restart
        (``RESTART``) finds it serving: health must not say SERVING on a
        watch that no longer looks."""
        # A restart starts its backoff afresh: the dead run's may have reached
        # its cap, and a service that serves meanwhile would wait that long.
        self._retry.reset()
        try:
            await self._watch()
        except Exception as exc:
            self._lost(f"the image backend's watch failed: {exc!r}")
            raise
        finally:
            if self._change is not None:
                self._change[1].cancel()
                self._change = None

    async def _watch(self) -> None:
        state = self._channel.get_state(try_to_connect=True)
        while True:
            retry = await self._seen(state)
            # READY and not serving (``retry``): probe again after the
            # backoff, at a change of state, or at a change of plan.
            await self._pause(state, retry)
            state = self._channel.get_state(try_to_connect=True)

    def _changed(self, state: grpc.ChannelConnectivity) -> asyncio.Future[None]:
        """The wait for the channel to leave ``state``: the one already under
        way for it, else a new one (one for another state is dropped: its
        failure, if it failed, is the watch's)."""
        if self._change is not None and self._change[0] is not state:
            old, self._change = self._change[1], None
            if old.done():
                old.result()
            old.cancel()
        if self._change is None:
            self._change = (state, asyncio.ensure_future(self._channel.wait_for_state_change(state)))
        return self._change[1]

    async def _pause(self, state: grpc.ChannelConnectivity, delay: float | None) -> None:
        """Until the channel leaves ``state``, or (``delay`` given) ``delay``
        seconds pass or the plan changes. The wait for the change outlives a
        pause that ends otherwise (the next one takes it up); its failure is
        the watch's."""
        change = self._changed(state)
        others: list[asyncio.Future[Any]] = [] if delay is None else [
            asyncio.ensure_future(self._sleep(delay)), asyncio.ensure_future(self._replanned.wait())]
        try:
            await asyncio.wait((change, *others), return_when=asyncio.FIRST_COMPLETED)
            if change.done():
                self._change = None
                change.result()
        finally:
            for other in others:
                other.cancel()

    async def _seen(self, state: grpc.ChannelConnectivity) -> float | None:
        """Judge ``state``; the seconds before the next probe when it is READY and does not serve."""
        if state is _S.READY:
            probed = await image_probe(self._channel, PROBE_TIMEOUT)
            if probed.reason is None:
                self._serving(probed)
            else:
                self._lost(probed.reason)
            if probed.reason is None and probed.failed is None:
                self._retry.reset()
                return None
            # Down, or a version failed: its answer may come at the next probe.
            # A plan change from here on wakes the pause (no await before it
            # starts); one before is in ``_cap`` already.
            self._replanned.clear()
            return self._retry.next((probed.reason is None, probed.versions, probed.unknown), self._cap(probed))
        # The connection left READY: the next one is a new look, its backoff afresh.
        self._retry.reset()
        if state is _S.TRANSIENT_FAILURE:
            self._lost("connection failed")
        return None

    def _cap(self, probed: Probed) -> float:
        """The backoff's ceiling: RETRY_MAX unless the service serves and
        the versions failing are none image calls are sent in (as the plan
        is at this probe; one before the plan counts as sent in)."""
        if probed.reason is not None or self.targets is None:
            return RETRY_MAX
        return RETRY_MAX if probed.failing & self.targets else VERSION_RETRY_MAX

    def _serving(self, probed: Probed) -> None:
        name = str(self.socket)
        fields: dict[str, object] = {"backend": name, "versions": _named(probed.versions, probed.unknown)}
        if probed.failed is not None:
            fields["version_problem"] = probed.failed
        was = self.versions
        changed = (probed.versions, probed.unknown) != (self.versions, self.unknown)
        self.versions, self.unknown = probed.versions, probed.unknown
        self.version_problem = probed.failed
        if self.up:  # e.g. reconnected after its idle timeout: nothing to tell, unless it serves other versions
            if changed:
                # One gone that image calls are sent in (any, before a plan) is
                # a loss: those calls now fail. One added, or gone unused, news.
                gone = (was or frozenset()) - probed.versions
                level = logging.WARNING if gone & (self.targets if self.targets is not None else gone) else logging.INFO
                log.log(level, "image backend serves other CRI versions",
                        extra={**fields, "was": sorted(str(v) for v in was or ())})
                self._warn_lacking()
                self._tell(True)
            return
        self.up = True
        self.reason = self.lost_reason = None
        if self._outages.down(name):
            self._outages.succeeded(name, fields, first=not self._was_up)
        else:
            log.info("image backend connected", extra=fields)
        self._was_up = True
        self._warn_lacking()
        self._tell(True)

    def _lost(self, reason: str) -> None:
        name = str(self.socket)
        was, self.reason = self.reason, reason
        if not self.up and self._outages.down(name):
            self._outages.counted(name)  # the outage under way: its end line counts it
            if reason != was:  # a change of why, not each probe: a service down for hours is probed every RETRY_MAX
                log.debug("image backend still not serving", extra={"backend": name, "reason": reason})
            return
        self.up = False
        self.lost_reason = reason
        self._lack_told = None  # back, a version it still lacks is told again
        # The outage starts at the loss (or, at start, at the first failure):
        # this line pairs with its end.
        self._outages.began(
            name, logging.WARNING, "image backend unavailable" if self._was_up else "image backend not reachable yet",
            {"backend": name, "reason": reason})
        self._outages.counted(name)
        self._tell(False)

    def _tell(self, up: bool) -> None:
        """One listener's failure is its own: the others (health, the metric) still hear it."""
        for listener in self._listeners:
            try:
                listener(up)
            except Exception:
                log.exception("image backend listener failed",
                              extra={"backend": str(self.socket), "up": up, "listener": repr(listener)})
