"""A logger's records handed to a test as they are logged."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def handled(name: str, level: int, emit: Callable[[logging.LogRecord], None]) -> Iterator[None]:
    """``emit`` is given each record of the logger ``name`` from ``level`` up,
    while inside; the logger's own level is put back after."""

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            emit(record)

    handler = Handler()
    logger = logging.getLogger(name)
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
