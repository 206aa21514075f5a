"""containerd 1.7.13 with NRI for the NRI integration tests: the shared
binaries unpacked once (cached by their sha256), a session containerd that
serves NRI, and the NRI plugin run in-process against it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.process import HostProcessError
from runtimeproxy.nri.app import NriPlugin, NriSettings

from ..prerequisites import fail_or_skip
from .conftest import START_TIMEOUT, STOP_TIMEOUT, LoopThread, require_local_containerd

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("RUNTIME_PROXY_SHARED", ROOT.parent / "shared"))
ARCHIVE = SHARED / "containerd-1.7" / "containerd-1.7.13.tar.xz"
CACHE = Path(tempfile.gettempdir()) / "runtime-proxy-cache"


def containerd17_bin_dir() -> Path:
    """The unpacked ``bin/`` of the shared containerd 1.7.13 (once per archive content)."""
    if not ARCHIVE.is_file():
        fail_or_skip(f"no containerd 1.7 archive at {ARCHIVE} (set RUNTIME_PROXY_SHARED)")
    digest = hashlib.sha256(ARCHIVE.read_bytes()).hexdigest()
    target = CACHE / f"containerd-{digest}"
    if not (target / "bin" / "containerd").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=CACHE, prefix="unpacking-"))
        try:
            with tarfile.open(ARCHIVE, "r:xz") as archive:
                archive.extractall(staging, filter="data")
            try:
                staging.rename(target)  # atomic: another run may have got there first
            except OSError:
                if not (target / "bin" / "containerd").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target / "bin"


@pytest.fixture(scope="session")
def containerd17(tmp_path_factory: pytest.TempPathFactory, fixture_loop: LoopThread) -> Iterator[LocalContainerd]:
    """containerd 1.7.13 with NRI enabled on ``nri_socket``, images imported."""
    require_local_containerd()
    runtime = LocalContainerd(tmp_path_factory.mktemp("containerd17"), bin_dir=containerd17_bin_dir(), nri=True)
    try:
        try:
            fixture_loop.run(runtime.start(timeout=START_TIMEOUT), START_TIMEOUT + 10)
        except HostProcessError as exc:
            pytest.fail(f"could not start containerd 1.7: {exc}", pytrace=False)
        yield runtime
    finally:
        fixture_loop.run(runtime.stop(timeout=STOP_TIMEOUT), STOP_TIMEOUT + 10)


@contextlib.asynccontextmanager
async def nri_plugin(runtime: LocalContainerd, hook_dir: Path, **settings: object) -> AsyncIterator[NriPlugin]:
    """The NRI plugin, registered and synchronized with ``runtime``; stopped at the end."""
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
    import watchfiles

    def seen() -> bool:
        return path.is_file() and message in path.read_text()

    if seen():
        return
    stop = asyncio.Event()
    async with asyncio.timeout(timeout):
        async for _ in watchfiles.awatch(path.parent, stop_event=stop, rust_timeout=500, yield_on_timeout=True):
            if seen():
                return
    raise AssertionError(f"{path} never said {message!r}")
