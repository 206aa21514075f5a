"""Real hook-server processes for tests (``python -m hooks.testserver``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hooks.sdk import write_hook_config
from runtimeproxy.app import RunningProxy
from runtimeproxy.host.process import terminate_process

from .filewatch import until_on_disk

NOBODY = 65534


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
        await until_on_disk(self.record.parent, lambda: len(self.records(hook)) >= count,
                            f"{count} {hook} request(s) received by {self.record.stem}", timeout)

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


# A hook server as its own process, run as ``uid`` from before it binds and
# listens (what a server's SO_PEERCRED tells). Started as root (the
# interpreter may be where only root may read), it imports first all it will
# need. "ready" once it listens, "called" at each call; it stops when its
# stdin closes.
_SERVED_AS = """
import asyncio, concurrent.futures.thread, os, sys
from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookServer

os.setgroups([])
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[2]))

class Server(HookServer):
    async def pre_create_container(self, request):
        print("called", flush=True)
        return hookapi.ContainerResourceHookResponse()

async def main():
    async with Server(sys.argv[1]):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@contextlib.contextmanager
def dir_for_nobody() -> Iterator[Path]:
    """A directory nobody may bind in and others may not write to (pytest's
    tmp_path is under a directory only root may enter). Needs root."""
    path = Path(tempfile.mkdtemp(prefix="hooks-nobody-", dir="/tmp"))  # not $TMPDIR: maybe where nobody cannot enter
    try:
        path.chmod(0o755)
        os.chown(path, NOBODY, NOBODY)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class ServedBy:
    process: asyncio.subprocess.Process
    calls: int = 0  # counted once it stopped


@contextlib.asynccontextmanager
async def served_by_nobody(path: Path) -> AsyncIterator[ServedBy]:
    """A hook server (PreCreateContainer, an empty answer) at ``path`` in a
    process run as nobody. Needs root."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SERVED_AS, str(path), str(NOBODY),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    server = ServedBy(process)
    assert process.stdin is not None and process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        if line != b"ready\n":
            raise RuntimeError(f"hook server at {path} did not start: {line!r}")
        yield server
        process.stdin.close()  # its cue to stop: what it printed till then counts its calls
        server.calls += (await asyncio.wait_for(process.stdout.read(), 30)).count(b"called\n")
        await asyncio.wait_for(process.wait(), 30)
    finally:
        # Whatever failed above (a hung start, a test's error): never left running.
        await terminate_process(process, 10, "nobody's hook server")
