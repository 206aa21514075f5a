from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for unix sockets (tmp_path may exceed the 107-byte sun_path limit)."""
    d = Path(tempfile.mkdtemp(prefix="sk-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The root logger's handlers and level, and those logs.setup sets, put back: a test running a
    command (runtime-proxy serve, nri) leaves no INFO level nor stderr handler to the tests after it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved = {name: logging.getLogger(name).level for name in ("grpc", "watchfiles", "hpack")}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, saved_level in saved.items():
            logging.getLogger(name).setLevel(saved_level)
