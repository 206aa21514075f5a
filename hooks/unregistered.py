"""A hook point a serving :class:`hooks.sdk.HookServer` handles that no hook
file written for its socket lists: warned at start, naming the handler.

The proxy calls a server only for the hook points its hook file lists, so a
handler left out of the list (``write_hook_config(..., ["PreCreateContainer"])``
beside a ``pre_update_container_resources``) is never called, and its server
says nothing. Known here is what this process does: the servers it serves
(``serving``, ``stopped``) and the hook files it writes (``written``), each
file's hook points counted while it exists. A server registered by another
process, or by hand, is not checked.

The check runs once the event loop's current step is done, so that hook
files written one after the other (two files for one server, one per
failure policy, say) count together, whichever of file and server comes
first. Each hook point is warned about once per socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from runtimeproxy.hookpath.points import HookType

__all__ = ["serving", "stopped", "written"]

log = logging.getLogger(__name__)

_serving: dict[str, Mapping[HookType, str]] = {}  # socket: the server's handlers (handlers.handled_hooks)
_written: dict[str, dict[Path, frozenset[HookType]]] = {}  # socket: the hook files naming it, their hook points
_warned: set[tuple[str, HookType]] = set()


def serving(socket_path: str, handled: Mapping[HookType, str]) -> None:
    """A server started at ``socket_path``, handling ``handled``."""
    socket_path = os.path.normpath(socket_path)
    _serving[socket_path] = handled
    _soon(socket_path)


def stopped(socket_path: str) -> None:
    _serving.pop(os.path.normpath(socket_path), None)


def written(path: Path, endpoint: str, hooks: Iterable[HookType]) -> None:
    """A hook file ``path`` was written naming ``endpoint`` and ``hooks``."""
    endpoint = os.path.normpath(endpoint)
    for files in _written.values():  # a file rewritten for another socket no longer names its old one
        files.pop(path, None)
    _written.setdefault(endpoint, {})[path] = frozenset(hooks)
    _soon(endpoint)


def _soon(socket_path: str) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop, so no server of this process serves yet: its start checks
        _check(socket_path)
        return
    loop.call_soon(_check, socket_path)


def _check(socket_path: str) -> None:
    handled = _serving.get(socket_path)
    files = {path: hooks for path, hooks in _written.get(socket_path, {}).items() if path.exists()}
    if not handled or not files:
        return
    listed = frozenset().union(*files.values())
    for hook, handler in handled.items():
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
