"""Proxies in front of the session's real containerd, on the test's loop."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from grpc import aio

from runtimeproxy.app import RunningProxy, build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.unixsocket import grpc_target


class ProxyLauncher:
    """Starts proxies (and stops them) in a short socket directory."""

    def __init__(self, backend: Path, stack: contextlib.AsyncExitStack) -> None:
        self.backend = backend
        self.dir = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))
        self.hook_dir = self.dir / "hooks.d"
        self.hook_dir.mkdir(mode=0o755)
        self.socket = self.dir / "proxy.sock"
        self._stack = stack
        stack.callback(shutil.rmtree, self.dir, True)

    async def start(self, wait: bool = True, **settings: Any) -> tuple[RunningProxy, contextlib.AsyncExitStack]:
        """A running proxy and the stack that stops it (closed at teardown anyway)."""
        own = contextlib.AsyncExitStack()
        self._stack.push_async_callback(own.aclose)
        config = ProxyConfig(listen=self.socket, backend=self.backend, hook_dir=self.hook_dir, **settings)
        running = await build_proxy(config, own)
        if wait:
            await running.proxy.wait_ready(30)
        return running, own

    def channel(self) -> aio.Channel:
        return aio.insecure_channel(grpc_target(self.socket))


@pytest_asyncio.fixture
async def launcher(containerd: LocalContainerd) -> AsyncIterator[ProxyLauncher]:
    async with contextlib.AsyncExitStack() as stack:
        yield ProxyLauncher(containerd.socket, stack)


@pytest_asyncio.fixture
async def proxy_channel(launcher: ProxyLauncher) -> AsyncIterator[aio.Channel]:
    """A channel to a proxy (no hooks) in front of the session containerd."""
    await launcher.start()
    async with launcher.channel() as channel:
        yield channel
