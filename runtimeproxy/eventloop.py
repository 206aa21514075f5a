"""The event loop a process runs on: asyncio's own, or uvloop's.

Every grpc.aio object of the process binds to the one loop it runs on (its
completion-queue poller wakes the loop through ``add_reader``, which both loops
support); a process therefore picks its loop once, at start, here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# auto: uvloop when it is installed (it is a dependency; a build without it still runs)
EVENT_LOOPS = ("auto", "asyncio", "uvloop")
# Why `uvloop` cannot be had, for serve's refusal and check-config's error alike.
UVLOOP_MISSING = "uvloop is not installed (pip install uvloop, or use asyncio)"
UVLOOP_REFUSED = f"event-loop 'uvloop': {UVLOOP_MISSING}"  # the config setting refused, as serve and check-config say it


class EventLoopError(RuntimeError):
    """The event loop asked for cannot be had."""


def uvloop_available() -> bool:
    """Whether uvloop imports here (installed, and built for this Python)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(choice: str, available: bool | None = None) -> str:
    """The loop ``choice`` means here: ``asyncio`` or ``uvloop``
    (``available``: whether uvloop is installed; None: look)."""
    if choice not in EVENT_LOOPS:
        raise EventLoopError(f"event loop {choice!r}: expected one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return choice
    if available is None:
        available = uvloop_available()
    if choice == "auto":
        return "uvloop" if available else "asyncio"
    if not available:
        raise EventLoopError(f"event loop 'uvloop': {UVLOOP_MISSING}")
    return choice


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A new-loop function for ``asyncio.Runner``; None: asyncio's default."""
    if loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """``asyncio.run(main)`` on the loop ``choice`` resolves to."""
    factory = loop_factory(resolve(choice))
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """What the running loop is, for the log: ``uvloop`` or ``asyncio``."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
