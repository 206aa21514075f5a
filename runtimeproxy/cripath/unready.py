"""Whether the runtime, though its socket takes connections, is known not to serve calls yet.

The outage gate (unreachable.py) judges a hooked call by grpc's channel: a
runtime that listens is READY. Two runtimes that listen still fail every call:

- containerd's CRI plugin answers every CRI call (Version and Status too)
  "server is not initialized yet" from the moment it listens until it has
  loaded its state (its instrumented service's checkInitialized): a few
  seconds after each start. containerd 1.6 and 1.7 answer UNKNOWN; 2.x
  UNAVAILABLE, the message then ending ": unavailable";
- a runtime that accepts a connection and never sends its HTTP/2 SETTINGS
  (hung, or not a gRPC server): the frames path bounds the wait for them
  (frames/silent.py).

Either is seen on some answer (a call's, a probe's, a frames connection's),
and ``saw`` records it; so is the runtime's loss (backend.py), so that a
restarted runtime's hooked calls wait for its first answer, not race the
backend's probe of it: from then on hooked calls are refused before any hook
is asked, on both data paths, until a cheap call of the proxy's own (Status,
every RECHECK_S) is answered, or a probe of the backend succeeds (``ready``).
The check on a hooked call is one attribute read (``reason is None``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc import aio

log = logging.getLogger(__name__)

# containerd's words for a CRI plugin still loading its state: UNKNOWN in
# 1.6 and 1.7, UNAVAILABLE "server is not initialized yet: unavailable" in 2.x.
NOT_INITIALIZED = "server is not initialized yet"
UNKNOWN = grpc.StatusCode.UNKNOWN.value[0]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
FAILED_STATUSES = (UNKNOWN, UNAVAILABLE)  # the statuses 'not initialized yet' comes with
RECHECK_S = 0.5  # how often the runtime is asked (Status) while it does not serve


def not_initialized(status: int, message: str) -> bool:
    """Whether an answer (its grpc-status number and message) is containerd's 'not initialized yet'."""
    return status in FAILED_STATUSES and NOT_INITIALIZED in message


async def serves(channel: aio.Channel, timeout: float) -> bool:
    """Whether the runtime on ``channel`` serves calls now: its Status
    answered, in v1 or else v1alpha2. Any status but 'not initialized',
    UNAVAILABLE or DEADLINE_EXCEEDED is an answer too (a runtime whose Status
    fails otherwise still serves the rest); so is Status in neither version."""
    for package in ("runtime.v1", "runtime.v1alpha2"):
        try:
            await channel.unary_unary(f"/{package}.RuntimeService/Status")(b"", timeout=timeout)
        except aio.AioRpcError as err:
            code = err.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                continue
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False
            return not not_initialized(code.value[0], err.details() or "")
        return True
    return True


class Unready:
    """What the runtime at ``socket`` last showed it is not ready for, if anything.

    ``serves``: the runtime's Status call, True if answered, False if the
    runtime says it does not serve yet or cannot be asked (raises nothing)."""

    def __init__(self, socket: Path, serves: Callable[[], Awaitable[bool]] | None = None,
                 recheck_s: float = RECHECK_S) -> None:
        """``serves`` None: nothing can ask the runtime (one never told, ``saw`` not called)."""
        self.socket = socket
        self.reason: str | None = None  # None: no sign the runtime does not serve
        self._serves = serves
        self._recheck_s = recheck_s
        self._since = 0.0
        self._recovery = logging.INFO  # the level of the episode's end line
        self._served = False  # the runtime was seen to serve (ready) before: its recovery is 'again'
        self._task: asyncio.Task[None] | None = None  # the Status re-check, one per episode
        self.episode = 0  # counts the times the runtime was seen not to serve (reason set from None)
        self._closed = False  # the backend is closed: nothing is asked again

    def saw(self, reason: str, level: int = logging.WARNING, recovery: int | None = None) -> None:
        """An answer showed the runtime does not serve (``reason``, for the
        refusals and the log): refuse hooked calls until it is seen to.
        ``level``: the log lines' (DEBUG where the outage has its own lines).
        ``recovery``: the level of the line that ends the episode (default:
        ``level``, at most INFO); INFO for a caller that warned of it itself
        (frames/silent.py), so the operator sees the end of what was warned
        of. The episode's end is logged at the highest its sightings asked for."""
        recovery = min(level, logging.INFO) if recovery is None else recovery
        if self.reason is not None:
            self.reason = reason
            self._recovery = max(self._recovery, recovery)
            return
        self.reason = reason
        self.episode += 1
        self._since = time.monotonic()
        self._recovery = recovery
        log.log(level, "the runtime does not serve calls yet: hooked calls are refused before their hooks until it does",
                extra={"backend": str(self.socket), "reason": reason})
        if self._serves is not None and not self._closed and (self._task is None or self._task.done()):
            # A context of its own: saw() is called from a call's task, whose
            # context (its runtime_gate, say) is not the re-check's. The task
            # ends with the episode (ready) or the backend (close).
            self._task = asyncio.get_running_loop().create_task(
                self._recheck(), name="runtime-unready-recheck", context=contextvars.Context())

    def ready(self) -> None:
        """The runtime answered a call of the proxy's own (a probe, a Status)."""
        served, self._served = self._served, True
        if self.reason is None:
            return
        reason, self.reason = self.reason, None
        # 'again' only after it served: a runtime still loading its state at
        # the proxy's start never did.
        log.log(self._recovery, f"the runtime serves calls {'again' if served else 'now'}: hooked calls go on",
                extra={"backend": str(self.socket), "reason": reason,
                       "seconds": round(time.monotonic() - self._since, 2)})
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._task = None

    def refusal_text(self, asked_some: bool = False) -> str:
        """A hooked call's refusal; ``asked_some``: refused between its pre
        hooks, after some of its chain was asked."""
        asked = "no later hook server of its chain was asked" if asked_some else "no hook server was asked"
        return (f"runtime-proxy: the runtime at {self.socket} does not serve calls yet ({self.reason}); "
                f"the call was not sent and {asked}")

    async def _recheck(self) -> None:
        assert self._serves is not None
        while self.reason is not None:
            await asyncio.sleep(self._recheck_s)
            try:
                answered = await self._serves()
            except Exception:  # (a channel closed under it, say): asked again next time
                log.debug("the runtime's Status could not be asked", extra={"backend": str(self.socket)},
                          exc_info=True)
                answered = False
            if answered and self.reason is not None:
                self.ready()

    def close(self) -> None:
        """The backend's channels close: the re-check ends, and none starts again."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
