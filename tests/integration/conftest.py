"""Fixtures for integration tests against a real, private containerd.

The session's containerd (and loopback registry) are started and stopped on
an event loop in a background thread: they keep asyncio subprocesses between
start() and stop(), which must stay on one loop, while the tests run on
pytest-asyncio's per-test loops. Tests talk to them only over sockets, so
they make their own grpc channels (see `cri_channel`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from grpc import aio

from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.images import BUSYBOX_BINARY
from runtimeproxy.host.process import HostProcessError

from ..prerequisites import fail_or_skip
from .containerd17 import containerd17_bin_dir
from .registry import LoopbackRegistry

T = TypeVar("T")

START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Everything under tests/integration needs root and containerd: mark it so `-m` can select it.
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)


def missing_prerequisites() -> list[str]:
    missing = [] if os.geteuid() == 0 else ["root privileges"]
    missing += [f"`{tool}` binary" for tool in ("containerd", "ctr", "runc") if shutil.which(tool) is None]
    if not BUSYBOX_BINARY.is_file():
        missing.append(f"{BUSYBOX_BINARY} (Debian package busybox-static)")
    return missing


def registry_missing() -> list[str]:
    return [f"`{tool}` binary (Debian package {tool})" for tool in ("docker-registry", "skopeo")
            if shutil.which(tool) is None]


def require_local_containerd() -> None:
    missing = missing_prerequisites()
    if missing:
        fail_or_skip("integration tests need " + ", ".join(missing))


class LoopThread:
    """An event loop running in a daemon thread; run() executes a coroutine on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@pytest.fixture(scope="session")
def fixture_loop() -> Iterator[LoopThread]:
    """The loop that owns the session's containerd and registry processes."""
    loop = LoopThread("integration-fixtures")
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def _registry_if_installed(tmp_path_factory: pytest.TempPathFactory,
                           fixture_loop: LoopThread) -> Iterator[LoopbackRegistry | None]:
    # Started before containerd, which needs the registry's address in its config.
    if registry_missing() or missing_prerequisites():
        yield None
        return
    registry = LoopbackRegistry(tmp_path_factory.mktemp("registry"))
    try:
        try:
            fixture_loop.run(registry.start(), START_TIMEOUT)
            fixture_loop.run(registry.push_busybox(), START_TIMEOUT)
        except HostProcessError as exc:
            pytest.fail(f"could not start the loopback registry: {exc}", pytrace=False)
        yield registry
    finally:
        fixture_loop.run(registry.stop(), STOP_TIMEOUT)


# The backends every test on `containerd` runs against: Debian's 1.6, and the
# shared 1.7.13 build (with NRI enabled, which the NRI tests use).
CONTAINERD_BUILDS = ("1.6", "1.7")
# Longer than containerd's 2 s default, so that a loaded test machine does not
# make containerd drop the NRI plugin; the component tests keep to the 2 s.
NRI_REQUEST_TIMEOUT = 5.0


@pytest.fixture(scope="session", params=CONTAINERD_BUILDS, ids=lambda build: f"containerd{build}")
def containerd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, fixture_loop: LoopThread,
               _registry_if_installed: LoopbackRegistry | None) -> Iterator[LocalContainerd]:
    """A started private containerd with the busybox and pause images imported.

    If the loopback registry runs, containerd pulls from it over plain HTTP.
    """
    require_local_containerd()
    registry = _registry_if_installed
    nri = request.param == "1.7"
    runtime = LocalContainerd(tmp_path_factory.mktemp("containerd"),
                              plain_http_registries=(registry.host,) if registry else (),
                              bin_dir=containerd17_bin_dir() if nri else None, nri=nri,
                              request_timeout=NRI_REQUEST_TIMEOUT)
    try:
        try:
            fixture_loop.run(runtime.start(timeout=START_TIMEOUT), START_TIMEOUT + 10)
        except HostProcessError as exc:
            pytest.fail(f"could not start containerd: {exc}", pytrace=False)
        yield runtime
    finally:
        fixture_loop.run(runtime.stop(timeout=STOP_TIMEOUT), STOP_TIMEOUT + 10)


@pytest.fixture(scope="session")
def registry(containerd: LocalContainerd,
             _registry_if_installed: LoopbackRegistry | None) -> LoopbackRegistry:
    """The loopback registry `containerd` can pull from; holds registry.ref() (busybox, cmd sh)."""
    if _registry_if_installed is None:
        fail_or_skip("pull tests need " + ", ".join(registry_missing()))
    return _registry_if_installed


@pytest_asyncio.fixture
async def own_containerd(tmp_path: Path) -> AsyncIterator[LocalContainerd]:
    """A LocalContainerd of the test's own, not started: for tests that start and stop it.

    Stopped again at teardown (stop() is idempotent), in case the test failed midway.
    """
    require_local_containerd()
    runtime = LocalContainerd(tmp_path / "containerd")
    yield runtime
    await runtime.stop()


@pytest_asyncio.fixture
async def cri_channel(containerd: LocalContainerd) -> AsyncIterator[aio.Channel]:
    """A grpc.aio channel to the session containerd, on the test's own event loop."""
    async with aio.insecure_channel(containerd.address) as channel:
        yield channel


@pytest.fixture
def pod_log_dir(tmp_path: Path) -> Path:
    """A directory for PodSandboxConfig.log_directory."""
    path = tmp_path / "pod-logs"
    path.mkdir()
    return path


# Proxies in front of the session containerd (fixtures `launcher`, `proxy_channel`).
from .proxyfixtures import launcher, proxy_channel  # noqa: E402,F401
