"""What :func:`hooks.sdk.run` takes away: the hook files the SDK wrote during
it for a server it served then.

Once a server stops, a hook file still naming its socket has the proxy call a
socket nobody answers: under ``Fail`` every call of the file's hook points is
refused, under ``Ignore`` each logs a failure. So each hook file that
:func:`hooks.sdk.write_hook_config` wrote during ``run`` (in its context: the
main task, tasks it made, ``asyncio.to_thread``) naming the socket of a
:class:`hooks.sdk.HookServer` started during it is removed, logged at info:

* as that server stops, first (``HookServer.stop``, before its listener
  closes, its socket lock still held: the proxy stops calling before the
  server stops answering, as ``hook run`` does); the server then keeps
  answering for its ``drain`` while the proxy notices;
* as ``run`` ends (``main`` returned, raised or was cancelled; Ctrl-C), for a
  server never stopped.

A file written with ``remove_with_server=False`` is kept (a ``Fail`` hook that
wants calls refused while it is down). A file removed already, or replaced
since by another writer (a new instance in a rolling update: not the file
written, by inode and change times), is left alone; one that cannot be
removed is a warning naming it. A file naming a socket no server of the run
served (a script registering a server running elsewhere) stays.

SIGTERM is not handled here: without a handler of the script's own it ends
the process at once, as Python does, and the files stay (README: "Writing a
hook server" handles it). A handler here would compete with the script's.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["FileIdentity", "RunScope", "scope", "served", "wrote"]

log = logging.getLogger("hooks.sdk")

_CURRENT: ContextVar[RunScope | None] = ContextVar("hooks_run_scope", default=None)


@dataclass(frozen=True)
class FileIdentity:
    """A file as written. An inode freed is reused at once (ext4), so another
    writer's file may have ours: its change and modification times tell it."""

    dev: int
    ino: int
    ctime_ns: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns)


def remove_if_ours(path: Path, identity: FileIdentity) -> Literal["removed", "replaced", "gone"]:
    """Remove ``path`` if it is still the file written as ``identity``; another
    writer's file in its place is left alone ("replaced"). OSError if it cannot be removed."""
    try:
        if FileIdentity.of(os.stat(path)) != identity:
            return "replaced"
        path.unlink()
    except FileNotFoundError:
        return "gone"
    return "removed"


@dataclass(frozen=True)
class _Written:
    endpoint: str  # absolute socket path
    identity: FileIdentity


@dataclass
class RunScope:
    """One ``run``'s hook files and served sockets (from any thread of its context, so behind a lock)."""

    _written: dict[Path, _Written] = field(default_factory=dict)  # the last write per path
    _served: set[str] = field(default_factory=set)  # started and not stopped
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wrote(self, path: Path, endpoint: str, identity: FileIdentity | None) -> None:
        """The last write of ``path``; None: one to keep (or gone already)."""
        with self._lock:
            if identity is None:
                self._written.pop(path, None)
            else:
                self._written[path] = _Written(os.path.abspath(endpoint), identity)

    def served(self, socket_path: str) -> None:
        with self._lock:
            self._served.add(os.path.abspath(socket_path))

    def stopping(self, socket_path: str) -> bool:
        """The server at ``socket_path`` is stopping: its files removed now.
        Whether this run registered it (a file to remove, or one removed or
        replaced since): the proxy may have calls under way to it, so its
        stop drains."""
        endpoint = os.path.abspath(socket_path)
        with self._lock:
            self._served.discard(endpoint)
            left = [(path, written) for path, written in self._written.items() if written.endpoint == endpoint]
            for path, _ in left:
                del self._written[path]
        for path, written in left:
            _remove(path, written, "its server is stopping")
        return bool(left)

    def remove_left(self) -> None:
        """Remove the hook files of this run's servers never stopped, once (it is ending)."""
        with self._lock:
            left = [(path, written) for path, written in self._written.items() if written.endpoint in self._served]
            self._written.clear()
        for path, written in left:
            _remove(path, written, "run ended, and its server with it")


def wrote(path: Path, endpoint: str, remove: bool) -> None:
    """``write_hook_config`` wrote ``path`` naming ``endpoint``: recorded in the running ``run``, if any."""
    current = _CURRENT.get()
    if current is None:
        return
    identity = None
    if remove:
        try:
            identity = FileIdentity.of(os.stat(path))
        except OSError:  # gone already: nothing to remove
            pass
    current.wrote(Path(path).absolute(), endpoint, identity)


def served(socket_path: str) -> RunScope | None:
    """A ``HookServer`` started serving at ``socket_path``: recorded in the
    running ``run``, if any, which it tells as it stops (returned)."""
    current = _CURRENT.get()
    if current is not None:
        current.served(socket_path)
    return current


@contextmanager
def scope() -> Iterator[RunScope]:
    """One ``run``: its servers' files removed as it ends."""
    current = RunScope()
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)
        current.remove_left()


def _remove(path: Path, written: _Written, why: str) -> None:
    fields = {"hook_file": str(path), "socket": written.endpoint}
    try:
        outcome = remove_if_ours(path, written.identity)
        if outcome == "replaced":
            log.info("hook file %s was replaced by another writer since this run wrote it; left", path, extra=fields)
        if outcome != "removed":
            return
    except OSError as exc:
        log.warning(
            "cannot remove hook file %s: the proxy goes on calling %s, which no longer serves, under the file's "
            "failure policy (Fail: every call of its hook points refused) until it is removed",
            path, written.endpoint, extra={**fields, "error": str(exc)})
        return
    log.info("hook file %s removed: %s", path, why, extra=fields)
