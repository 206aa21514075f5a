"""One log line per hook server per outage, not one per failed call.

A registered hook server that is down fails every CRI call that reaches it:
with many such servers, a line per failure buries everything else. The first
failure of an outage is logged in full; repeats are counted and summarised at
most once per ``interval`` (on the next failure after it); the first success
ends the outage with one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

__all__ = ["OutageLog"]

SUMMARY_INTERVAL = 60.0  # seconds


@dataclass
class _Outage:
    started: float
    window_start: float  # start of the current summary window
    repeats: int = 0  # failures not logged since window_start
    total: int = 1


class OutageLog:
    """Per-server outage state of one dispatcher (not shared, no global state)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = SUMMARY_INTERVAL,
    ) -> None:
        self._log = logger
        self._clock = clock
        self._interval = interval
        self._outages: dict[str, _Outage] = {}

    def failed(self, server: str, level: int, message: str, fields: Mapping[str, object]) -> None:
        """A call to ``server`` failed: log ``message`` if it starts an outage, else count it."""
        now = self._clock()
        outage = self._outages.get(server)
        if outage is None:
            self._outages[server] = _Outage(started=now, window_start=now)
            self._log.log(level, message, extra={**fields, "hook_outage": "started"})
            return
        outage.repeats += 1
        outage.total += 1
        elapsed = now - outage.window_start
        if elapsed >= self._interval:
            self._log.log(
                level,
                "hook server %s still failing: %d failures in the last %ds",
                server, outage.repeats, round(elapsed),
                extra={**fields, "hook_outage": "ongoing", "hook_failures": outage.repeats,
                       "hook_outage_seconds": round(now - outage.started, 1)},
            )
            outage.window_start, outage.repeats = now, 0

    def succeeded(self, server: str, fields: Mapping[str, object]) -> None:
        """A call to ``server`` worked: end its outage, if any, with one line."""
        outage = self._outages.pop(server, None)
        if outage is not None:
            seconds = self._clock() - outage.started
            self._log.info(
                "hook server %s recovered after %.1fs and %d failed calls", server, seconds, outage.total,
                extra={**fields, "hook_outage": "ended", "hook_failures": outage.total,
                       "hook_outage_seconds": round(seconds, 1)},
            )

    def keep_only(self, servers: Collection[str]) -> None:
        """Forget the outages of servers no longer registered."""
        for name in set(self._outages) - set(servers):
            del self._outages[name]

    def failing(self) -> frozenset[str]:
        return frozenset(self._outages)
