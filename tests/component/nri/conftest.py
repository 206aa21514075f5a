from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cri_api.nri import api_pb2 as nri
from runtimeproxy.nri.app import NriPlugin, NriSettings

from .fakeruntime import FakeRuntime, PluginLink, fake_runtime


@pytest.fixture
async def runtime(sock_dir: Path) -> AsyncIterator[FakeRuntime]:
    async with fake_runtime(sock_dir / "nri.sock") as fake:
        yield fake


PluginFactory = Callable[..., Any]


@pytest.fixture
async def start_plugin(sock_dir: Path, hook_dir: Path) -> AsyncIterator[PluginFactory]:
    """Start NRI plugins on the fake runtime's socket; all stop afterwards."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**settings: Any) -> NriPlugin:
            settings.setdefault("socket_path", sock_dir / "nri.sock")
            settings.setdefault("max_backoff", 0.2)
            plugin = NriPlugin(NriSettings(hook_dir=hook_dir, **settings))
            stop = asyncio.Event()
            task = asyncio.create_task(plugin.run(stop))

            async def halt() -> None:
                stop.set()
                await asyncio.wait_for(task, 10)

            stack.push_async_callback(halt)
            return plugin

        yield start


@pytest.fixture
async def connect(runtime: FakeRuntime, start_plugin: PluginFactory) -> PluginFactory:
    """Start a plugin and take it through registration with these pods and containers."""

    async def connect(
        pods: list[nri.PodSandbox] | None = None, containers: list[nri.Container] | None = None, **settings: Any
    ) -> tuple[NriPlugin, PluginLink]:
        plugin = await start_plugin(**settings)
        link = await runtime.next_link()
        await link.handshake(pods, containers)
        return plugin, link

    return connect


def pod(pod_id: str = "pod-1", uid: str = "uid-1", **labels: str) -> nri.PodSandbox:
    return nri.PodSandbox(
        id=pod_id,
        name="web",
        uid=uid,
        namespace="default",
        labels={"app": "web", **labels},
        annotations={"pod-note": "x"},
        runtime_handler="runc",
        linux=nri.LinuxPodSandbox(
            cgroup_parent="/kubepods/burstable/pod" + uid,
            cgroups_path="/kubepods/burstable/pod" + uid + "/" + pod_id,
        ),
    )


def container(container_id: str = "ctr-1", pod_id: str = "pod-1", uid: str = "uid-1") -> nri.Container:
    return nri.Container(
        id=container_id,
        pod_sandbox_id=pod_id,
        name="app",
        state=nri.CONTAINER_CREATED,
        annotations={"c-note": "y"},
        env=["PATH=/bin", "KEEP=original"],
        linux=nri.LinuxContainer(
            cgroups_path=f"/kubepods/burstable/pod{uid}/{container_id}",
            resources=nri.LinuxResources(
                cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=256)),
                memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30)),
            ),
        ),
    )
