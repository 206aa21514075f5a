"""Registering a hook server with the proxy: the Koordinator-format hook file.

``write_hook_config`` is also importable from :mod:`hooks.sdk`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from runtimeproxy.hookpath.hookfile import (
    KEY_ANSWERS,
    KEY_ENDPOINT,
    KEY_FAILURE_POLICY,
    KEY_PRIORITY,
    KEY_RUNTIME_HOOKS,
    KEY_TIMEOUT,
    FailurePolicy,
    HookConfigError,
    format_duration,
    parse_hook_document,
)
from runtimeproxy.hookpath.points import HookType

from . import runscope, unregistered
from .statefile import fsync_dir, write_atomic

__all__ = ["write_hook_config"]

log = logging.getLogger(__name__)


def write_hook_config(
    directory: str | os.PathLike[str],
    name: str,
    endpoint: str | os.PathLike[str],
    hooks: Iterable[HookType | str],
    failure_policy: FailurePolicy | str = "Ignore",
    timeout: str | float | None = None,
    priority: int | None = None,
    answers: str | None = None,
    *,
    log_level: int = logging.INFO,
    remove_with_server: bool = True,
) -> Path:
    """Atomically write a Koordinator-format hook file ``directory/name[.json]``; returns its path.

    ``timeout`` is a duration string ("500ms") or seconds (0.5 -> "500ms");
    ``None`` omits the key (the proxy's default applies), as do ``priority=None``
    and ``answers=None`` (``"changes"`` or ``"whole"``: docs/hook-files.md).
    The document is validated like the proxy would before anything is written
    (``ValueError`` otherwise).  The file is written to a temporary file in the
    same directory, fsync-ed, chmod-ed 0644 and renamed into place, so the
    proxy never sees a partial file.  A missing directory is created (0755).
    It is logged (``hook file written``, with its hook points) at
    ``log_level``: ``hook run``, which logs its own ``hook registered``, at debug.
    Written under :func:`hooks.sdk.run` for a server started under it, it is
    removed as that server stops (before its listener closes) or, one never
    stopped, as ``run`` ends, if still there as written (``hooks.runscope``);
    ``remove_with_server=False`` keeps it: under ``Fail``, calls are then
    refused while the server is down, rather than going on unhooked.
    """
    directory = Path(directory)
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"invalid hook file name {name!r}")
    if not name.endswith(".json"):
        name = f"{name}.json"
    if name.startswith("."):
        raise ValueError(f"hook file name {name!r} must not start with '.' (hidden files are ignored)")

    hook_names: list[str] = []
    for hook in hooks:
        try:
            value = HookType(hook).value
        except ValueError:
            raise ValueError(f"unknown runtime hook {hook!r}") from None
        if value not in hook_names:
            hook_names.append(value)
    try:
        policy = FailurePolicy(failure_policy).value
    except ValueError:
        raise ValueError(f"unknown failure policy {failure_policy!r}") from None

    doc: dict[str, object] = {
        KEY_ENDPOINT: os.fspath(endpoint),
        KEY_FAILURE_POLICY: policy,
        KEY_RUNTIME_HOOKS: hook_names,
    }
    if timeout is not None:
        doc[KEY_TIMEOUT] = timeout if isinstance(timeout, str) else format_duration(timeout)
    if priority is not None:
        doc[KEY_PRIORITY] = priority
    if answers is not None:
        doc[KEY_ANSWERS] = answers
    try:
        parse_hook_document(directory / name, doc)
    except HookConfigError as exc:
        raise ValueError(str(exc)) from None

    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
    data = (json.dumps(doc, indent=2) + "\n").encode()
    final = directory / name
    write_atomic(final, data, mode=0o644, sync_dir=False)
    try:
        fsync_dir(directory)
    except OSError:  # pragma: no cover - best effort durability
        pass
    log.log(log_level, "hook file written", extra={
        "hook_file": str(final), "socket": os.fspath(endpoint), "hooks": hook_names, "failure_policy": policy,
        "timeout": doc.get(KEY_TIMEOUT), "priority": priority, "answers": answers})
    unregistered.written(final, os.fspath(endpoint))  # never raises: the file is written
    runscope.wrote(final, os.fspath(endpoint), remove_with_server)  # under hooks.sdk.run: removed with its server
    return final
