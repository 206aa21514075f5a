"""The stop signals every serving command (serve, nri, hook run) ends on in
its orderly stop, and the start-ups a stop signal cuts short (or what else
ends a command's serving, given to StopSignal.end)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# SIGHUP too: a closed terminal or `kill -HUP` would otherwise end the process
# at once, with no clean-up (sockets, registrations, a --local-containerd and
# its shims, which run in a session of their own and never see the hangup).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignal(asyncio.Event):
    """Set by the first stop signal, ``received`` naming it (None: none yet),
    or by ``end`` for what else ends serving, ``reason`` saying what."""

    def __init__(self) -> None:
        super().__init__()
        self.received: str | None = None
        self.reason: str | None = None

    def end(self, reason: str) -> None:
        """Ends serving as a stop signal would, for ``reason`` (a serving
        command's own: serve --local-containerd's containerd exiting); after
        a signal or an earlier end, changes nothing."""
        if not self.is_set():
            self.reason = reason
            self.set()

    async def unless_signalled(self, start: Awaitable[T]) -> T | None:
        """``start``'s result; None if a stop signal (or ``end``) came first,
        ``start`` then cancelled (it undoes its own steps): a start-up that
        waits, as for a socket path's lock, must not outlast the unit's stop
        timeout. A start so cancelled that fails as it undoes its steps is
        logged (a warning, ``cut_by`` saying which signal or reason), and
        None returned all the same: the stop goes on."""
        task = asyncio.ensure_future(start)
        signalled = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait({task, signalled}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this caller cancelled: the start undoes its steps before it ends
            signalled.cancel()
            task.cancel()
            await asyncio.gather(task, signalled, return_exceptions=True)
            raise
        signalled.cancel()
        cut_short = task.cancel()  # False once it is done
        try:
            return await task
        except asyncio.CancelledError:
            if task.cancelled() and not asyncio.current_task().cancelling():  # type: ignore[union-attr]  # in a task: this coroutine runs in one
                return None  # cancelled above, not this caller
            raise
        except Exception as exc:
            if not cut_short:  # it failed on its own
                raise
            cut_by = f"signal {self.received}" if self.received is not None else self.reason
            log.warning("start-up cut short; undoing it failed",
                        exc_info=True, extra={"cut_by": cut_by, "error": str(exc)})
            return None


def stop_on_signals() -> StopSignal:
    """An event set by SIGTERM, SIGINT or SIGHUP (installed before start-up, so
    that a signal during start-up also ends in an orderly shutdown); SIGHUP not
    when the process was started with it ignored (``nohup``)."""
    stop = StopSignal()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        if sig is signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # started under nohup: the hangup is meant to pass it by
        loop.add_signal_handler(sig, _on_stop_signal, stop, sig)
    return stop


def _on_stop_signal(stop: StopSignal, sig: signal.Signals) -> None:
    # Logged here, in one line, for every command that uses these handlers (they
    # log none of their own); a second signal during the shutdown is logged
    # too, and changes nothing.
    reason = (signal.strsignal(sig) or sig.name).lower()
    if stop.received is None:
        stop.received = sig.name
        log.info("signal received, shutting down", extra={"signal": sig.name, "reason": reason})
    else:
        log.info("signal received, already shutting down", extra={"signal": sig.name, "reason": reason})
    stop.set()
