"""A hook point a serving :class:`hooks.sdk.HookServer` handles that no hook
file for its socket lists: warned, naming the handler.

The proxy calls a server only for the hook points its hook file lists, so a
handler left out of the list (``write_hook_config(..., ["PreCreateContainer"])``
beside a ``pre_update_container_resources``) is never called, and its server
says nothing. Checked: each server this process serves (``serving``,
``stopped``) against the hook files naming its socket in the directories this
process wrote one to (``written``), read when the check runs, as the proxy
reads them: every such file counts, one written by hand or by another process
too, and a file removed or rewritten for another socket no longer does. A
server none of whose hook files this process wrote is not checked, nor are
files in other directories.

The check runs on the server's event loop ``DELAY`` seconds after the
server starts or a hook file for its socket is written (from the loop or
from another thread), the wait starting again with each write: files
written one after another (one per failure policy, say) are read together.
Each hook point is warned about once per socket; the check never fails a
write. A server that stops before its check runs (within ``DELAY`` of its
start or of a write) is not checked: a test's, mostly, and its hook files
are most often gone by then (removed before the stop, as they should be).
Nor is a server whose hook files another process wrote, in a directory this
one never wrote to: the SDK is not told the proxy's hook directory, and
reading one it guessed could warn by a file the proxy does not read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtimeproxy.hookpath.hookdir import list_hook_files
from runtimeproxy.hookpath.hookfile import HookConfigError, parse_hook_file
from runtimeproxy.hookpath.points import HookType

__all__ = ["DELAY", "serving", "stopped", "written"]

log = logging.getLogger(__name__)

DELAY = 1.0  # seconds from a server's start or a hook file's write to the check


@dataclass
class _Served:
    handled: Mapping[HookType, str]  # the server's handlers (handlers.handled_hooks)
    loop: asyncio.AbstractEventLoop  # it serves on: the check runs there
    timer: asyncio.TimerHandle | None = None  # the check to come (touched on the loop only)


# Written from any thread (write_hook_config may run off the loop), so behind a lock.
_lock = threading.Lock()
_serving: dict[str, _Served] = {}  # socket: its server
_directories: dict[str, set[Path]] = {}  # socket: the directories this process wrote a hook file naming it to
_warned: set[tuple[str, HookType]] = set()


def serving(socket_path: str, handled: Mapping[HookType, str]) -> None:
    """A server started at ``socket_path`` on the running loop, handling ``handled``."""
    socket_path = _key(socket_path)
    with _lock:
        _serving[socket_path] = _Served(handled, asyncio.get_running_loop())
    _arm(socket_path)


def stopped(socket_path: str) -> None:
    """Its server stopped (on its loop): no check for it."""
    with _lock:
        served = _serving.pop(_key(socket_path), None)
    if served is not None and served.timer is not None:
        served.timer.cancel()


def written(path: Path, endpoint: str) -> None:
    """A hook file ``path`` was written naming ``endpoint``, from any thread:
    the server there, if this process serves one, is checked soon. Never raises."""
    try:
        socket_path = _key(endpoint)
        with _lock:
            _directories.setdefault(socket_path, set()).add(Path(path).parent)
            served = _serving.get(socket_path)
            if served is not None and served.loop.is_closed():  # its loop ended without stop(): no server there
                del _serving[socket_path]
                served = None
        if served is not None:
            served.loop.call_soon_threadsafe(_arm, socket_path)
    except Exception:  # its loop closed meanwhile, say: the file is written, the check is only advice
        log.debug("unregistered handlers not checked", exc_info=True, extra={"hook_file": str(path)})


def _key(socket_path: str | os.PathLike[str]) -> str:
    return os.path.abspath(socket_path)


def _arm(socket_path: str) -> None:
    """On the server's loop: the check in ``DELAY``, the wait started again."""
    with _lock:
        served = _serving.get(socket_path)
        if served is None:
            return
        if served.timer is not None:
            served.timer.cancel()
        served.timer = served.loop.call_later(DELAY, _check, socket_path)


def _check(socket_path: str) -> None:
    try:
        _warn_unlisted(socket_path)
    except Exception:  # advice only: never the loop's trouble
        log.debug("unregistered handlers not checked", exc_info=True, extra={"socket": socket_path})


def _warn_unlisted(socket_path: str) -> None:
    with _lock:
        served = _serving.get(socket_path)
        directories = sorted(_directories.get(socket_path, ()))
    if served is None:
        return
    files = _files_naming(socket_path, directories)
    if not files:
        return
    listed = frozenset().union(*files.values())
    for hook, handler in served.handled.items():
        with _lock:
            if hook in listed or (socket_path, hook) in _warned:
                continue
            _warned.add((socket_path, hook))
        log.warning(
            "%s handles %s, but no hook file for its socket lists it: the proxy calls only the hook points a "
            "hook file lists, so it is never called (add it to write_hook_config's hooks)",
            handler, hook.value,
            extra={"handler": handler, "hook": hook.value, "socket": socket_path,
                   "hook_files": [str(path) for path in files]},
        )


def _files_naming(socket_path: str, directories: list[Path]) -> dict[Path, frozenset[HookType]]:
    """The hook files in ``directories`` whose endpoint is ``socket_path``,
    each with its hook points, as the proxy reads them (an invalid one lists none)."""
    files = {}
    for directory in directories:
        try:
            paths = list_hook_files(directory)
        except OSError:
            continue
        for path in paths:
            try:
                server = parse_hook_file(path, check_permissions=False)
            except (HookConfigError, OSError):
                continue
            if _key(server.endpoint) == socket_path:
                files[path] = server.hooks
    return files
