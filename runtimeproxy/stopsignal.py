"""The stop signals every serving command (serve, nri, hook run) ends on in
its orderly stop, and the start-ups a stop signal cuts short (or, for serve
--local-containerd, its private containerd's exit)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# SIGHUP too: a closed terminal or `kill -HUP` would otherwise end the process
# at once, with no clean-up (sockets, registrations, a --local-containerd and
# its shims, which run in a session of their own and never see the hangup).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignal(asyncio.Event):
    """Set by the first stop signal; ``received`` names it (None: none yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.received: str | None = None

    async def unless_signalled(self, start: Awaitable[T], until: asyncio.Future[Any] | None = None) -> T | None:
        """``start``'s result; None if a stop signal came first, or the end of
        ``until`` (what ends serving besides a signal, as a private
        containerd's exit; not cancelled here, the caller reads it), ``start``
        then cancelled (it undoes its own steps): a start-up that waits, as
        for a socket path's lock, must not outlast the unit's stop timeout.
        A start so cancelled that fails as it undoes its steps is logged (a
        warning, ``cut_by`` saying which), and None returned all the same:
        the stop goes on."""
        task = asyncio.ensure_future(start)
        signalled = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait({task, signalled, *([until] if until is not None else [])},
                               return_when=asyncio.FIRST_COMPLETED)
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
            if task.cancelled() and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                return None  # cancelled above, not this caller
            raise
        except Exception as exc:
            if not cut_short:  # it failed on its own
                raise
            cut_by = f"signal {self.received}" if self.is_set() else "private containerd exited"
            log.warning("start-up cut short (stop signal or private containerd's exit); undoing it failed",
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
