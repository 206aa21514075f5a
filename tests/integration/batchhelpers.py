"""For the batchresource end-to-end tests: the hook as a ``runtime-proxy hook run``
process, its JSON log lines as events, and pod cgroups made as kubelet makes them."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runtimeproxy.host.containerd import terminate_process

CGROUP_ROOT = Path("/sys/fs/cgroup")
LogLine = dict[str, Any]


@dataclass
class HookRun:
    """A running ``runtime-proxy hook run batchresource`` and what it has logged."""

    process: asyncio.subprocess.Process
    lines: list[LogLine] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"msg": raw.decode(errors="replace").rstrip()}
            async with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    async def logged(self, match: Callable[[LogLine], bool], timeout: float = 15.0, start: int = 0) -> LogLine:
        """The first log line ``match`` accepts, waiting (bounded) for it to be written;
        ``start``: an index in ``lines`` (a count taken earlier), the lines before it left out.
        On a timeout, the AssertionError shows the hook's last lines (what it did instead)."""
        try:
            async with asyncio.timeout(timeout), self._changed:
                while True:
                    found = next((line for line in self.lines[start:] if match(line)), None)
                    if found is not None:
                        return found
                    if self.process.returncode is not None:
                        raise AssertionError(f"hook exited {self.process.returncode}; it logged {self.lines}")
                    await self._changed.wait()
        except TimeoutError:
            last = "\n".join(json.dumps(line) for line in self.lines[-40:])
            raise AssertionError(f"no matching hook log line within {timeout} s; its last lines:\n{last}") from None


@contextlib.asynccontextmanager
async def batchresource_hook(directory: Path, hook_dir: Path, **settings: Any) -> AsyncIterator[HookRun]:
    """The hook process, serving and registered in ``hook_dir`` (Fail policy: a hook error would show)."""
    config = directory / "batchresource.yaml"
    config.write_text(yaml.safe_dump({"cgroup_driver": "cgroupfs", "state_dir": str(directory / "batch-state"), **settings}))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "hook", "run", "batchresource",
        "--socket", str(directory / "batchresource.sock"), "--hook-dir", str(hook_dir),
        "--failure-policy", "Fail", "--timeout", "15s", "--config", str(config), "--log-format", "json", "--drain", "0",
        stderr=asyncio.subprocess.PIPE,
    )
    run = HookRun(process)
    reader = asyncio.create_task(run._read())
    try:
        await run.logged(lambda line: line.get("msg") == "hook registered", timeout=30)
        yield run
    finally:
        await terminate_process(process, 10, "batchresource hook")
        await reader


def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy: kubelet makes a pod's cgroup in each v1 one, and
    runc also uses the unified one of a hybrid host, which must be cleaned up too."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, target, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            mounts.append(Path(target))
    return mounts


@dataclass
class PodCgroup:
    """A pod's cgroup_parent, made in every hierarchy like kubelet's cgroupfs driver does."""

    parent: str
    created: list[Path] = field(default_factory=list)

    @classmethod
    def new(cls, uid: str) -> PodCgroup:
        return cls(f"/rp-batch-{uuid.uuid4().hex[:8]}/besteffort/pod{uid}")

    def path(self, controller: str) -> Path:
        return CGROUP_ROOT / controller / self.parent.lstrip("/")

    def value(self, controller: str, name: str) -> int:
        return int((self.path(controller) / name).read_text())

    def write(self, controller: str, name: str, value: int) -> None:
        (self.path(controller) / name).write_text(str(value))

    def make(self) -> None:
        parts = self.parent.strip("/").split("/")
        for hierarchy in hierarchies():
            directory = hierarchy
            for part in parts:
                parent, directory = directory, directory / part
                if directory.is_dir():
                    continue
                directory.mkdir()
                self.created.append(directory)
                if (directory / "cpuset.cpus").exists():  # a cpuset cgroup takes no task until these are set
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        (directory / name).write_text((parent / name).read_text())

    async def remove(self) -> None:
        """Deepest first; a cgroup runc is still tearing down gets a few bounded retries."""
        for directory in reversed(self.created):
            for attempt in range(50):
                try:
                    for child in sorted((p for p in directory.iterdir() if p.is_dir()), reverse=True):
                        os.rmdir(child)  # a container cgroup runc left behind
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 49:
                        raise
                    await asyncio.sleep(0.1)
        self.created.clear()
