"""The built-in hook servers that ``runtime-proxy hook run NAME`` serves.

A built-in hook is a :class:`~hooks.sdk.HookServer` with a name, the hook
points it handles, a way to be built from its YAML config, and optional work
of its own that runs while it serves (a reconcile loop). The runner
(``runtime-proxy hook run``) owns the lifecycle: it builds the server, starts
it, writes the registration file, runs :meth:`BuiltinHook.background` beside
it and stops both on SIGTERM.

Built-in hooks are named here by import path, so that listing them does not
import every hook's dependencies.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from runtimeproxy.hookpath.points import HookType

from .errors import HookServerError
from .handlers import handled_hooks
from .sdk import HookServer


class HookConfigInvalid(ValueError):
    """A built-in hook's config is not valid; the message names the key and the reason."""


class BuiltinUnavailable(ImportError):
    """A built-in hook is named but cannot be loaded (its module or a dependency is missing)."""


class BuiltinHook(HookServer):
    NAME: ClassVar[str]
    SUMMARY: ClassVar[str]  # one line, for ``hook list``
    HOOKS: ClassVar[tuple[HookType, ...]]  # the hook points it registers for
    PRIORITY: ClassVar[int | None] = None  # registered with, without --priority (None: the proxy's default)
    # Its --config file, set before it serves (hooks/cli.py): a hook that
    # reloads its config (balloons, a property there) watches this file.
    config_file: Path | None

    @classmethod
    def from_config(cls, socket_path: str, config: Mapping[str, Any]) -> BuiltinHook:
        """Build the server from its YAML config (``{}`` when none is given);
        raise :class:`HookConfigInvalid` for a bad one."""
        if config:
            raise HookConfigInvalid(f"this hook takes no settings, got {', '.join(sorted(map(str, config)))}")
        return cls(socket_path)

    def __init__(self, socket_path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(socket_path, **options)
        # A whole start has succeeded: once stopped, a hook used once (_used_up) is refused a start.
        self._served = False

    async def background(self) -> None:
        """Work that runs while the server serves; cancelled at shutdown."""

    def _used_up(self) -> str | None:
        """Override for a hook used once (its stop closes something for
        good): what is closed, for the error; None while it can start. Asked
        only of a hook whose start succeeded: what the release step of a
        start that failed closed, the next start opens again under the lock
        (the subclass's ``_before_serving``)."""
        return None

    async def _start_beside(self) -> None:
        """Override to start what serves beside the hook server (balloons'
        status socket), once it listens: part of the start, which a second
        :meth:`start` under way shares and a stop cuts. Its failure (or a
        cut) stops the hook before the start raises; stop it in
        ``_before_stop``."""

    async def _start(self) -> None:
        """The whole start, which ``HookServer.start`` runs once for all its
        callers under way (hooks.sharedrun): a hook used once
        (:meth:`_used_up`) that served and was stopped is a HookServerError
        (build a new one); then the server (HookServer's start) and
        :meth:`_start_beside`. Only its end marks the hook as served: a start
        that failed (or was cut by a stop) leaves the hook as it was, and a
        start again serves once the cause is gone."""
        closed = self._used_up() if self._served else None
        if closed is not None:
            raise HookServerError(f"a {type(self).__name__} is used once: it served and was stopped ({closed}); "
                                  "build a new one to serve again")
        await super()._start()
        try:
            await self._start_beside()
        except BaseException:
            # Not cut by a further stop (it waits for this); this start's own stop does not wait for itself.
            self._starting.finishing()
            await self.stop(0, drain=0)  # a full stop: what the stop's steps close, and the last writes, under the lock
            raise
        self._served = True


# name -> "module:Class"
BUILTIN_HOOKS: Mapping[str, str] = MappingProxyType(
    {
        "batchresource": "hooks.batchresource.server:BatchResourceHook",
        "noop": "hooks.noop:NoopHook",
        "balloons": "hooks.balloons.server:BalloonsHook",
    }
)


def load_builtin(name: str) -> type[BuiltinHook]:
    """The class of built-in hook ``name``.

    Raises :class:`LookupError` for a name that is not built in and
    :class:`BuiltinUnavailable` when its module cannot be imported."""
    try:
        target = BUILTIN_HOOKS[name]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_HOOKS))
        raise LookupError(f"no built-in hook named {name!r} (built-in hooks: {known})") from None
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except Exception as exc:  # a hook's import may fail any way; name the hook and the cause
        raise BuiltinUnavailable(f"built-in hook {name!r} cannot be loaded from {target}: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, BuiltinHook)):
        raise TypeError(f"{target} is not a BuiltinHook")
    unlisted = unlisted_handlers(cls)
    if unlisted:
        raise TypeError(f"built-in hook {name!r}: {'; '.join(unlisted)}")
    return cls


def unlisted_handlers(cls: type[BuiltinHook]) -> list[str]:
    """The handlers of ``cls`` for hook points its HOOKS leaves out, each
    said so: ``hook run`` registers HOOKS only, so the proxy would never
    call them. Checked where a built-in hook is loaded, not where a class is
    defined: a script's subclass of one is registered by its own hook file."""
    return [f"{handler} handles {hook.value}, which {cls.__qualname__}.HOOKS does not list: "
            "hook run registers only HOOKS, so the proxy would never call it"
            for hook, handler in handled_hooks(cls, HookServer).items() if hook not in cls.HOOKS]


@dataclass(frozen=True)
class BuiltinInfo:
    """What ``hook list`` shows of one built-in hook."""

    name: str
    summary: str
    hooks: tuple[HookType, ...]
    unavailable: str | None = None  # why it cannot be loaded here


def describe_builtins() -> list[BuiltinInfo]:
    """Every built-in hook, by name; one that cannot be imported here says why."""
    infos = []
    for name in sorted(BUILTIN_HOOKS):
        try:
            cls = load_builtin(name)
        except (BuiltinUnavailable, TypeError) as exc:
            infos.append(BuiltinInfo(name, "", (), unavailable=str(exc)))
            continue
        infos.append(BuiltinInfo(name, cls.SUMMARY, tuple(cls.HOOKS)))
    return infos
