"""One log line per outage, not one per failed call.

Something that is down (a hook server, the backend runtime) fails every call
or probe that reaches it: a line per failure buries everything else. The first
failure of an outage is logged in full; repeats are counted and summarised at
most once per ``interval`` (on the next failure after it); the first success
ends the outage with one line. An outage may also begin without a failure
(the backend's connection is lost): its first failure is then logged in full.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

__all__ = ["BACKEND", "HOOK_SERVER", "IMAGE_BACKEND", "OutageLog", "OutageWords", "SUMMARY_INTERVAL"]

SUMMARY_INTERVAL = 60.0  # seconds


@dataclass(frozen=True)
class OutageWords:
    """What one kind of outage's summary and end lines say.

    Messages are %-formats over the values their ``*_args`` name, in order:
    ``name`` (what is down), ``failures`` (so far), ``seconds`` (since the
    outage began), ``window_failures`` and ``window_seconds`` (since the last
    line)."""

    stem: str  # the fields STEM_outage (started, ongoing, ended), STEM_failures, STEM_outage_seconds
    ended: str
    ended_args: tuple[str, ...]
    ongoing: str = ""  # "": never said (an owner that only counts failures, never calls ``failed``)
    ongoing_args: tuple[str, ...] = ()
    window_counts: bool = False  # a summary's STEM_failures: since the last line; else since the outage began
    ended_first: str | None = None  # ended, of something never up before (at start); None: ended


HOOK_SERVER = OutageWords(
    stem="hook",
    ongoing="hook server %s still failing: %d failures in the last %ds",
    ongoing_args=("name", "window_failures", "window_seconds"),
    ended="hook server %s recovered after %.1fs and %d failed calls",
    ended_args=("name", "seconds", "failures"),
    window_counts=True,
)
BACKEND = OutageWords(
    stem="backend",
    ongoing="backend still not ready",
    ongoing_args=(),
    ended="backend ready again after %.1fs (%d failed probes)",
    ended_args=("seconds", "failures"),
    window_counts=False,
    ended_first="backend ready after %.1fs (%d failed probes)",
)
# A separate image service (cripath/imagewatch.py): its failures (failed
# probes, connection attempts seen failing) are counted, never summarised:
# its outages have only their two ends.
IMAGE_BACKEND = OutageWords(
    stem="image_backend",
    ended="image backend ready again after %.1fs (%d failures)",
    ended_args=("seconds", "failures"),
    ended_first="image backend ready after %.1fs (%d failures)",
)


@dataclass
class _Outage:
    started: float
    window_start: float | None  # start of the current summary window; None: no failure logged yet
    failures: int = 0
    repeats: int = 0  # failures not logged since window_start


class OutageLog:
    """Outage state per name (a hook server's, the backend's) of one owner:
    not shared, no global state."""

    def __init__(
        self,
        logger: logging.Logger,
        words: OutageWords = HOOK_SERVER,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = SUMMARY_INTERVAL,
    ) -> None:
        self._log = logger
        self._words = words
        self._clock = clock
        self._interval = interval
        self._outages: dict[str, _Outage] = {}

    def began(self, name: str, level: int, message: str, fields: Mapping[str, object]) -> None:
        """``name`` is known to be down without a failure of its own: log
        ``message``, starting its outage unless one is under way."""
        extra = dict(fields)
        if name not in self._outages:
            self._outages[name] = _Outage(started=self._clock(), window_start=None)
            extra[f"{self._words.stem}_outage"] = "started"
        self._log.log(level, message, extra=extra)

    def failed(
        self, name: str, level: int, message: str, fields: Mapping[str, object],
        detail: Mapping[str, object] | None = None, trailing: Mapping[str, object] | None = None,
    ) -> None:
        """A call to ``name`` failed. The outage's first failure logs
        ``message`` with ``fields``, ``detail``, ``trailing`` and the outage's
        state, in that order; later ones are counted, and summarised once the
        window is over with ``fields``, the outage's state and counts, and
        ``trailing``."""
        now, stem = self._clock(), self._words.stem
        outage = self._outages.get(name)
        if outage is None or outage.window_start is None:
            state = "started" if outage is None else "ongoing"
            if outage is None:
                outage = self._outages[name] = _Outage(started=now, window_start=None)
            outage.window_start, outage.repeats = now, 0
            outage.failures += 1
            extra = {**fields, **(detail or {}), **(trailing or {}), f"{stem}_outage": state}
            self._log.log(level, message, extra=extra)
            return
        outage.repeats += 1
        outage.failures += 1
        elapsed = now - outage.window_start
        if elapsed >= self._interval:
            values = {"name": name, "failures": outage.failures, "seconds": now - outage.started,
                      "window_failures": outage.repeats, "window_seconds": round(elapsed)}
            self._log.log(
                level, self._words.ongoing, *(values[arg] for arg in self._words.ongoing_args),
                extra={**fields, f"{stem}_outage": "ongoing",
                       f"{stem}_failures": outage.repeats if self._words.window_counts else outage.failures,
                       f"{stem}_outage_seconds": round(now - outage.started, 1), **(trailing or {})},
            )
            outage.window_start, outage.repeats = now, 0

    def counted(self, name: str) -> None:
        """A failure of ``name`` that its caller logged itself: counted, no
        line. It starts an outage if none is under way (a Fail hook's refusals
        are each logged, yet the end of their outage is one line like any)."""
        outage = self._outages.get(name)
        if outage is None:
            outage = self._outages[name] = _Outage(started=self._clock(), window_start=None)
        outage.failures += 1
        outage.repeats += 1

    def down(self, name: str) -> bool:
        """Whether ``name`` is in an outage (``succeeded`` would end it)."""
        return name in self._outages

    def succeeded(self, name: str, fields: Mapping[str, object], *, first: bool = False) -> None:
        """A call to ``name`` worked: end its outage, if any, with one line
        (``first``: it was never up before)."""
        outage = self._outages.pop(name, None)
        if outage is not None:
            seconds, stem = self._clock() - outage.started, self._words.stem
            values = {"name": name, "failures": outage.failures, "seconds": seconds}
            self._log.info(
                (first and self._words.ended_first) or self._words.ended,
                *(values[arg] for arg in self._words.ended_args),
                extra={**fields, f"{stem}_outage": "ended", f"{stem}_failures": outage.failures,
                       f"{stem}_outage_seconds": round(seconds, 1)},
            )

    def keep_only(self, names: Collection[str]) -> None:
        """Forget the outages of names no longer in use (servers no longer registered)."""
        for name in set(self._outages) - set(names):
            del self._outages[name]

    def failing(self) -> frozenset[str]:
        return frozenset(self._outages)
