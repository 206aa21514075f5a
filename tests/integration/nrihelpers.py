"""For the NRI integration tests: the NRI plugin run in-process against
the session's containerd 1.7.13 (which serves NRI), and plugin logs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.nri.app import NriPlugin, NriSettings

from ..filewatch import until_on_disk


@contextlib.asynccontextmanager
async def nri_plugin(runtime: LocalContainerd, hook_dir: Path, **settings: Any) -> AsyncIterator[NriPlugin]:
    """The NRI plugin, registered and synchronized with ``runtime``; stopped at the end.
    ``settings``: more NriSettings fields by name, each of its own type."""
    settings.setdefault("request_timeout", runtime.request_timeout)  # as containerd is configured
    plugin = NriPlugin(NriSettings(hook_dir=hook_dir, socket_path=runtime.nri_socket, max_backoff=0.5, **settings))
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        connected = asyncio.ensure_future(plugin.connected.wait())
        await asyncio.wait({connected, task}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if not connected.done():
            connected.cancel()
            raise AssertionError(f"NRI plugin did not synchronize; containerd log:\n{runtime.log_tail()}")
        yield plugin
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def logged(path: Path, message: str, timeout: float = 30.0) -> None:
    """Until a process has logged ``message`` to the file ``path`` (woken by
    file events, bounded by ``timeout``)."""
    await until_on_disk(path.parent, lambda: path.is_file() and message in path.read_text(),
                        f"{path} never said {message!r}", timeout)
