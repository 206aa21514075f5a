from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.host.containerd import terminate_process

REPO = Path(__file__).resolve().parents[3]
CREATE = "/runtime.v1.RuntimeService/CreateContainer"


def create_request() -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=v1.ContainerConfig(
            metadata=v1.ContainerMetadata(name="app"),
            envs=[v1.KeyValue(key="KEEP", value=b"1")],
            linux=v1.LinuxContainerConfig(resources=v1.LinuxContainerResources(cpu_shares=256)),
        ),
        sandbox_config=v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="web", uid="uid-1", namespace="default")),
    )


@dataclass
class HookRun:
    """A ``runtime-proxy hook run`` process and the log lines read from it so far."""

    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)

    async def wait_for(self, needle: str, timeout: float = 20) -> str:
        """The next log line containing ``needle`` (lines before it are kept in ``lines``)."""
        assert self.process.stderr is not None
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.process.stderr.readline()).decode()
                if not line:
                    raise AssertionError(f"hook run ended (exit {await self.process.wait()}) before {needle!r}: {self.lines}")
                self.lines.append(line)
                if needle in line:
                    return line

    async def finish(self, timeout: float = 20) -> tuple[int, str]:
        """Exit code and the rest of the log."""
        assert self.process.stderr is not None
        rest = (await asyncio.wait_for(self.process.stderr.read(), timeout)).decode()
        self.lines += rest.splitlines(keepends=True)
        return await asyncio.wait_for(self.process.wait(), timeout), rest


StartHook = Callable[..., Awaitable[HookRun]]


@pytest.fixture
async def hook_run() -> AsyncIterator[StartHook]:
    """Start ``hook run`` processes (``runtime-proxy`` with the test hooks
    added); any still running at the end is terminated."""
    processes: list[asyncio.subprocess.Process] = []

    async def start(*args: str, env: dict[str, str] | None = None) -> HookRun:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.component.hookrun.testhooks", "hook", "run", *args,
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        processes.append(process)
        return HookRun(process)

    yield start
    for process in processes:
        await terminate_process(process, 10, "hook run")
