"""What :func:`hooks.sdk.run` takes away as it ends: the hook files the SDK
wrote during it for a server it served then.

Once ``run`` ends the server is gone, whether ``stop`` was called or not, and
a hook file still naming its socket has the proxy call a socket nobody
answers: under ``Fail`` every call of the file's hook points is refused, under
``Ignore`` each logs a failure. So as ``run`` ends, by any path (``main``
returned or raised, was cancelled, or SIGTERM), each hook file that
:func:`hooks.sdk.write_hook_config` wrote during it (in its context: the main
task, tasks it made, ``asyncio.to_thread``) naming the socket of a
:class:`hooks.sdk.HookServer` started during it is removed, logged at info.
A file removed already, or replaced since by another writer (a new instance
in a rolling update: not the inode written), is left alone; one that cannot
be removed is a warning naming it. A file naming a socket no server of the
run served (a script registering a server running elsewhere) stays.

SIGTERM, which would kill the process at once, leaving the files behind,
cancels ``main`` instead, as asyncio's runner does on SIGINT: its
``finally`` blocks and ``async with`` exits run, the files are removed, then
the process dies of SIGTERM as it would have. A second SIGTERM kills it at
once. Only when ``run`` is called in the main thread and SIGTERM has no
handler yet; a handler ``main`` installs (``loop.add_signal_handler``)
replaces this one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["RunScope", "scope", "served", "wrote"]

T = TypeVar("T")

log = logging.getLogger("hooks.sdk")

_CURRENT: ContextVar[RunScope | None] = ContextVar("hooks_run_scope", default=None)


@dataclass(frozen=True)
class _Written:
    endpoint: str  # absolute socket path
    identity: tuple[int, int]  # st_dev, st_ino as written: another writer's file has another


@dataclass
class RunScope:
    """One ``run``'s hook files and served sockets (from any thread of its context, so behind a lock)."""

    handles_sigterm: bool
    terminated: bool = False  # SIGTERM cancelled main
    _written: dict[Path, _Written] = field(default_factory=dict)  # the last write per path
    _served: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wrote(self, path: Path, endpoint: str, identity: tuple[int, int]) -> None:
        with self._lock:
            self._written[path] = _Written(os.path.abspath(endpoint), identity)

    def served(self, socket_path: str) -> None:
        with self._lock:
            self._served.add(os.path.abspath(socket_path))

    def remove_left(self) -> None:
        """Remove the hook files of this run's servers, once (it is ending)."""
        with self._lock:
            left = [(path, written) for path, written in self._written.items() if written.endpoint in self._served]
            self._written.clear()
        for path, written in left:
            _remove(path, written)


def wrote(path: Path, endpoint: str) -> None:
    """``write_hook_config`` wrote ``path`` naming ``endpoint``: recorded in the running ``run``, if any."""
    current = _CURRENT.get()
    if current is None:
        return
    try:
        st = os.stat(path)
    except OSError:  # gone already: nothing to remove
        return
    current.wrote(Path(path).absolute(), endpoint, (st.st_dev, st.st_ino))


def served(socket_path: str) -> None:
    """A ``HookServer`` started serving at ``socket_path``: recorded in the running ``run``, if any."""
    current = _CURRENT.get()
    if current is not None:
        current.served(socket_path)


@contextmanager
def scope() -> Iterator[RunScope]:
    """One ``run``: its files removed as it ends, and SIGTERM's death after that."""
    handles = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    current = RunScope(handles_sigterm=handles)
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)
        current.remove_left()
        if current.terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)  # what SIGTERM would have done, the files removed first


async def guarded(main: Coroutine[Any, Any, T], current: RunScope) -> T:
    """``main``, cancelled by SIGTERM (see the module's doc)."""
    if not current.handles_sigterm:
        return await main
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, _terminate, task, current)
    try:
        return await main
    finally:
        loop.remove_signal_handler(signal.SIGTERM)  # SIGTERM's default again; main's own handler too, main is done


def _terminate(task: asyncio.Task[Any], current: RunScope) -> None:
    if current.terminated:  # the second: at once, as SIGTERM did before
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    current.terminated = True
    log.info("SIGTERM: main cancelled; the hook files of this run's servers are removed as run ends, then the "
             "process exits by SIGTERM (a second SIGTERM: at once)", extra={"signal": "SIGTERM"})
    task.cancel()


def _remove(path: Path, written: _Written) -> None:
    fields = {"hook_file": str(path), "socket": written.endpoint}
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) != written.identity:
            log.info("hook file %s was replaced by another writer since this run wrote it; left", path, extra=fields)
            return
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning(
            "cannot remove hook file %s as run ends: the proxy goes on calling %s, which no longer serves, under "
            "the file's failure policy (Fail: every call of its hook points refused) until it is removed",
            path, written.endpoint, extra={**fields, "error": str(exc)})
        return
    log.info("hook file %s removed: run ended, and its server with it", path, extra=fields)
