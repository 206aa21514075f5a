"""Built-in hooks that exist only for the tests of ``hook run``.

``python -m tests.component.hookrun.testhooks ARGS`` is ``runtime-proxy ARGS``
with these added to the built-in hooks, so that a test can run a hook whose
background work fails, or one that records what it saw when it was cancelled.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hooks import builtin
from hooks.builtin import BuiltinHook, HookConfigInvalid
from runtimeproxy.hookpath.points import HookType


class FailingHook(BuiltinHook):
    NAME = "failing"
    SUMMARY = "its background work fails at once"
    HOOKS = (HookType.PRE_CREATE_CONTAINER,)

    async def background(self) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("reconcile loop lost its source")


class WatchfulHook(BuiltinHook):
    """Its background work waits to be cancelled, then writes to ``record``
    whether the registration file and the socket still existed then."""

    NAME = "watchful"
    SUMMARY = "records the shutdown order"
    HOOKS = (HookType.PRE_START_CONTAINER, HookType.POST_STOP_CONTAINER)

    def __init__(self, socket_path: str, record: Path, registration: Path) -> None:
        super().__init__(socket_path)
        self.record, self.registration = record, registration

    @classmethod
    def from_config(cls, socket_path: str, config: Mapping[str, Any]) -> WatchfulHook:
        missing = {"record", "registration"} - set(config)
        if missing:
            raise HookConfigInvalid(f"missing keys {sorted(missing)}")
        return cls(socket_path, Path(config["record"]), Path(config["registration"]))

    async def background(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen = {"registration": self.registration.exists(), "socket": os.path.exists(self.socket_path)}
            self.record.write_text(json.dumps(seen))
            raise


class StuckHook(WatchfulHook):
    """A watchful hook whose registration cannot be removed, as in a hook
    directory remounted read-only (root may write through a mode 0555 one)."""

    NAME = "stuck"
    SUMMARY = "its registration cannot be removed"

    @classmethod
    def from_config(cls, socket_path: str, config: Mapping[str, Any]) -> WatchfulHook:
        hook = super().from_config(socket_path, config)
        unlink = Path.unlink

        def read_only(self: Path, missing_ok: bool = False) -> None:  # (Path.unlink's own parameters)
            if self == hook.registration:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
            unlink(self, missing_ok)

        # The method replaced on purpose (this hook server's process only): mypy refuses any method assignment.
        Path.unlink = read_only  # type: ignore[method-assign]
        return hook


TEST_HOOKS = {
    "failing": f"{__name__}:FailingHook", "watchful": f"{__name__}:WatchfulHook", "stuck": f"{__name__}:StuckHook",
}


if __name__ == "__main__":
    builtin.BUILTIN_HOOKS = MappingProxyType({**builtin.BUILTIN_HOOKS, **TEST_HOOKS})
    from runtimeproxy.cli import main

    main()
