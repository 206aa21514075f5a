"""Structured logging: one line per event, fields as key=value or JSON.

Call sites log a short event message and put the facts in ``extra``:
``log.warning("hook failed", extra={"hook": name, "error": str(exc)})``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname.lower(), record.name, repr(record.getMessage())]
        # A field with no value (None: no config file, no timeout) is left out; JSON keeps it, as null.
        parts += [f"{k}={_text(v)}" for k, v in _fields(record).items() if v is not None]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=_json_value)


def _json_value(value: object) -> object:
    # A set as a list, sorted (as a text line writes it): str() of a set is
    # "{'b', 'a'}", in hash order, which changes from one run to the next.
    if isinstance(value, (set, frozenset)):
        return _sorted(value)
    return str(value)


def _sorted(items: set[Any] | frozenset[Any]) -> list[Any]:
    try:
        return sorted(items)
    except TypeError:  # items of different kinds
        return sorted(items, key=str)


def _text(value: object) -> str:
    # A list as its items, comma-separated (as messages write them): Python's
    # "['A', 'B']" is neither a key=value value nor greppable. A set's sorted,
    # not in hash order, which changes from one run to the next.
    if isinstance(value, (set, frozenset)):
        value = _sorted(value)
    s = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return json.dumps(s) if (not s or any(c.isspace() or c in '"=' for c in s)) else s


class AnswerToAGoneClient(logging.Filter):
    """grpc logs an ERROR with a traceback (ExecuteBatchError) when a
    handler's answer cannot be sent because the call is already over in
    core: its client closed the connection before reading it (it only skips
    the log when it noticed the close first). Nobody is left to answer:
    benign, so one debug line naming the method instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc_type = record.exc_info[0] if record.exc_info else None
        if exc_type is None or exc_type.__name__ != "ExecuteBatchError":
            return True
        found = re.search(r"\[(.*)\]", record.getMessage())
        record.msg, record.args = "answer not sent: the client's connection closed", ()
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        record.method = found.group(1) if found else None
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def setup(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # grpc's own debug lines drown ours; its warnings still show.
    logging.getLogger("grpc").setLevel(max(logging.INFO, root.level))
    # hpack (the frames path's and the hook SDK's header codec) logs every
    # header it decodes at debug: hundreds of lines per pod, none ours.
    logging.getLogger("hpack").setLevel(max(logging.INFO, root.level))
    # watchfiles says "N changes detected" at info for every write in the hook
    # directory; the registry's own line says what changed. Shown at debug.
    quiet = logging.DEBUG if root.level <= logging.DEBUG else max(logging.WARNING, root.level)
    logging.getLogger("watchfiles").setLevel(quiet)
    core = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, AnswerToAGoneClient) for f in core.filters):
        core.addFilter(AnswerToAGoneClient())


@contextlib.contextmanager
def unless_configured(level: int = logging.INFO) -> Iterator[bool]:
    """While it runs, setup()'s text lines on stderr at ``level`` for the
    records no handler takes, unless the root logger has a handler (the
    process configured its logging: left alone). Ours is
    ``logging.lastResort`` (Python's writes bare messages, at WARNING and
    above), and the root level, if Python's default (WARNING), is ``level``:
    no handler is added anywhere, so logging set up meanwhile
    (``basicConfig``, ``dictConfig``), or on named loggers only, takes the
    records it handles, once, in its own format and at its own level.
    Both are put back at the end, unless changed meanwhile. Yields whether it
    set up."""
    root = logging.getLogger()
    if root.handlers:
        yield False
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(level)
    handler.setFormatter(TextFormatter())
    resort, before = logging.lastResort, root.level
    logging.lastResort = handler
    lowered = before == logging.WARNING
    if lowered:
        root.setLevel(level)
    try:
        yield True
    finally:
        if logging.lastResort is handler:
            logging.lastResort = resort
        if lowered and root.level == level and not root.handlers:  # else set since, by the process: its own
            root.setLevel(before)


def always(logger: logging.Logger, msg: str, **fields: object) -> None:
    """An info line written whatever --log-level is, by the handlers setup()
    made: what a person asked to be told (--local-containerd's hint, which
    text output prints at any level), not an event to filter."""
    record = logger.makeRecord(logger.name, logging.INFO, "(always)", 0, msg, (), None, extra=fields)
    for handler in logging.getLogger().handlers:
        handler.handle(record)
