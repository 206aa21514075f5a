"""A :class:`hooks.sdk.HookServer` stop's timings: its drain, and how long it may keep its socket's lock."""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger("hooks.sdk")

# A stop takes its grace and at most about this much more (closing the
# connections, then the listener); its drain (and ``hook run``'s --drain)
# comes before it, while the socket still answers (a new server is refused
# then, not waiting), so neither counts in the lock file's ``stop_s``.
STOP_PAST_GRACE_S = 1.0

# How long a stop keeps answering new calls once its server's hook file is
# gone, before its listener closes: the proxy reads the hook directory on
# inotify within a fraction of a second, and calls it started before then
# would otherwise be refused (under Fail, the CRI call). ``hook run``'s --drain.
DEFAULT_DRAIN_S = 0.5


def checked_drain(drain: float | None) -> float | None:
    """``drain``, or a ``ValueError`` for a negative one (the constructor's, a stop's before it stops anything)."""
    if drain is not None and drain < 0:
        raise ValueError(f"drain must be 0 or more seconds, not {drain!r}")
    return drain


def drain_for(drain: float | None, registered: bool) -> float:
    """The drain a stop waits: the one set (the stop's, else the
    constructor's); unset, :data:`DEFAULT_DRAIN_S` for a server a hook file
    of ``run``'s named (``registered``), else none: the SDK knows a proxy
    calls a server only from a file it wrote."""
    if drain is not None:
        return drain
    return DEFAULT_DRAIN_S if registered else 0.0


async def drain(seconds: float, registered: bool, socket: str) -> None:
    """Keep answering new calls (the listener open) for ``seconds``, logged at info saying why."""
    if seconds <= 0:
        return
    why = ("while the proxy notices its hook file is gone" if registered
           else "as its drain was set (a hook file removed outside run: the proxy may still call)")
    logger.info("hook server draining: answering new calls for %gs %s", seconds, why,
                extra={"socket": socket, "drain_s": seconds, "hook_file_removed_by_run": registered})
    await asyncio.sleep(seconds)


def stop_bound(grace: float | None, release_step_timeout: float) -> float:
    """How long a stop with ``grace`` may keep the lock, for the lock file's
    ``stop_s``: its grace, its close, and its bounded release step."""
    return (grace or 0.0) + STOP_PAST_GRACE_S + release_step_timeout
