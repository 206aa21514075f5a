from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import RunningProxy, build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy

from .fakes import FakeBackend

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
RUN_POD = "/runtime.v1.RuntimeService/RunPodSandbox"


@pytest.fixture
def sock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Unix socket paths are limited to 108 bytes: keep them short.
    return tmp_path_factory.mktemp("s", numbered=True)


@pytest.fixture
async def fake(sock_dir: Path) -> AsyncIterator[FakeBackend]:
    async with FakeBackend(sock_dir / "backend.sock") as backend:
        yield backend


@pytest.fixture
def hook_dir(sock_dir: Path) -> Path:
    path = sock_dir / "hooks.d"
    path.mkdir(mode=0o755)
    return path


@pytest.fixture
async def running(fake: FakeBackend, sock_dir: Path, hook_dir: Path) -> AsyncIterator[RunningProxy]:
    """The whole proxy (hook path on ``hook_dir``) in front of the fake backend."""
    fake.script(CREATE, response=v1.CreateContainerResponse(container_id="ctr-1").SerializeToString())
    fake.script(RUN_POD, response=v1.RunPodSandboxResponse(pod_sandbox_id="pod-1").SerializeToString())
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir)
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        yield running


ProxyFactory = Callable[..., Any]


@pytest.fixture
async def start_proxy(sock_dir: Path) -> AsyncIterator[ProxyFactory]:
    """Start a proxy in front of a socket; every proxy is stopped afterwards."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(backend: Path, wait: bool = True, stages: tuple = (), **settings: Any) -> Proxy:
            config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=backend, **settings)
            proxy = Proxy(config, stages=stages)
            await proxy.start()
            stack.push_async_callback(proxy.stop, 0)
            if wait:
                await proxy.wait_ready(10)
            return proxy

        yield start


@pytest.fixture
async def client(sock_dir: Path) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
        yield channel
