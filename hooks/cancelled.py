"""The log line of a hook handler cancelled before it answered, by cause.

A missed deadline is the hook's to fix (too slow for its hook file's
timeout): a warning. The caller hanging up (kubelet cancelling its CRI call,
the proxy stopping) or the server stopping is no fault of the handler: info.
"""

from __future__ import annotations

import logging

from runtimeproxy.hookpath.points import HookType

__all__ = ["log_cancelled"]


def log_cancelled(logger: logging.Logger, hook: HookType, ran_s: float, deadline_passed: bool) -> None:
    if deadline_passed:
        logger.warning("%s hook handler cancelled after %.3fs, before it answered: the caller's deadline (the hook "
                       "file's timeout) passed", hook.value, ran_s, extra={"hook": hook.value})
    else:
        logger.info("%s hook handler cancelled after %.3fs, before it answered: the caller hung up, or the "
                    "server stopped", hook.value, ran_s, extra={"hook": hook.value})
