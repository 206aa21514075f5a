"""The component suites of the CRI and hook paths, run again on ``--data-path frames``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy

from ..conftest import ProxyFactory


@pytest.fixture
async def start_proxy(sock_dir: Path) -> AsyncIterator[ProxyFactory]:
    """As tests/component/conftest.py's, on the frames data path."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(backend: Path, wait: bool = True, stages: tuple = (), **settings: Any) -> Proxy:
            settings.setdefault("data_path", "frames")
            config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=backend, **settings)
            proxy = Proxy(config, stages=stages)
            await proxy.start()
            stack.push_async_callback(proxy.stop, 0)
            if wait:
                await proxy.wait_ready(10)
            return proxy

        yield start
