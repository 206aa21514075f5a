"""Real hook-server processes for tests (``python -m hooks.testserver``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import watchfiles

from hooks.sdk import write_hook_config
from runtimeproxy.app import RunningProxy
from runtimeproxy.host.process import terminate_process


@dataclass
class HookProcess:
    name: str
    socket: Path
    record: Path
    process: asyncio.subprocess.Process

    def records(self, hook: str | None = None) -> list[dict[str, Any]]:
        """Every request the server received, in order: hook, time (when it arrived) and request."""
        if not self.record.exists():
            return []
        complete = self.record.read_text().split("\n")[:-1]  # a line still being written is not a record yet
        return [entry for entry in map(json.loads, complete) if hook is None or entry["hook"] == hook]

    def requests(self, hook: str | None = None) -> list[dict[str, Any]]:
        """What the server received, in order (proto field names)."""
        return [entry["request"] for entry in self.records(hook)]

    async def received(self, hook: str, count: int = 1, timeout: float = 10.0) -> None:
        """Until the server has received ``count`` requests of ``hook`` (file
        events on the record's directory; a periodic look as a backstop)."""

        async def watch() -> None:
            async for _ in watchfiles.awatch(self.record.parent, debounce=0, step=10, rust_timeout=500, yield_on_timeout=True):
                if len(self.records(hook)) >= count:
                    return

        if len(self.records(hook)) < count:
            await asyncio.wait_for(watch(), timeout)

    def register(
        self,
        hook_dir: Path,
        hooks: list[str],
        failure_policy: str = "Fail",
        timeout: str | None = None,
        priority: int | None = None,
        answers: str | None = None,
        name: str | None = None,
    ) -> Path:
        """``name``: the hook file's, if not the server's (``koordlet.json``)."""
        return write_hook_config(
            hook_dir, name or self.name, self.socket, hooks, failure_policy, timeout, priority, answers
        )


async def registered(running: RunningProxy, count: int) -> None:
    """Until the proxy's hook registry holds ``count`` hook servers (awaits the
    registry's change event; a reload makes it independent of watcher timing)."""
    await reloaded_until(running, lambda: len(running.registry.snapshot) == count)


async def reloaded_until(running: RunningProxy, done: Callable[[], bool]) -> None:
    """Until ``done()`` holds after a reload of the proxy's hook registry (its
    change event awaited between reloads)."""
    changed = asyncio.Event()
    unsubscribe = running.registry.on_change(lambda snapshot: changed.set())
    try:
        async with asyncio.timeout(5):
            while True:
                changed.clear()
                running.registry.reload()
                if done():
                    return
                await changed.wait()
    finally:
        unsubscribe()


@contextlib.asynccontextmanager
async def hook_server(directory: Path, name: str, config: dict[str, Any] | Path) -> AsyncIterator[HookProcess]:
    """Start a hook server process and wait until it says it listens (``config``: the
    script, or a file holding it: an argument cannot exceed 128 KiB)."""
    socket = directory / f"{name}.sock"
    record = directory / f"{name}.jsonl"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hooks.testserver",
        "--socket", str(socket), "--config", json.dumps(config) if isinstance(config, dict) else str(config), "--record", str(record),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 20)
        if line.strip() != b"ready":
            raise RuntimeError(f"hook server {name} did not start: {line!r}, exit {process.returncode}")
        yield HookProcess(name, socket, record, process)
    finally:
        await terminate_process(process, 10, f"hook server {name}")
