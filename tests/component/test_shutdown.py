"""The proxy's stop, in order: stop accepting, drain calls, finish recording,
stop the watcher and the rebuild, then close the channels."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.hookpath.hookfile import HookRegistry

from .fakes import FakeBackend

LIST_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"


def proxy_config(sock_dir: Path, fake: FakeBackend, **settings: object) -> ProxyConfig:
    hook_dir = sock_dir / "hooks.d"
    hook_dir.mkdir(mode=0o755, exist_ok=True)
    return ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir, **settings)


async def test_a_stop_during_a_rebuild_ends_the_rebuild_before_the_channels_close(
    fake, sock_dir, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rebuild that outlives the backend channel reads a closed channel
    # (its next call fails: "state rebuild failed" in the log) or has its
    # call cancelled under it; either way it must be stopped first.
    fake.script(LIST_PODS, hang=True)  # the start-up rebuild is still reading when the proxy stops
    caplog.set_level(logging.DEBUG)
    rebuilds_at_close: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(proxy_config(sock_dir, fake), stack)
        await running.proxy.wait_ready(10)
        await fake.wait_calls(LIST_PODS)
        real_close = running.proxy.backend.close

        async def backend_close() -> None:
            rebuilds_at_close.extend(
                t.get_name() for t in asyncio.all_tasks() if t.get_name() == "state-rebuild" and not t.done()
            )
            await real_close()

        monkeypatch.setattr(running.proxy.backend, "close", backend_close)
    assert rebuilds_at_close == []
    assert [r.getMessage() for r in caplog.records if "rebuild failed" in r.getMessage()] == []
    assert "stopped" in [r.getMessage() for r in caplog.records]


async def test_the_watcher_stops_with_the_server_before_the_channels_close(
    fake, sock_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    watching = asyncio.Event()
    real_watch = HookRegistry.watch

    async def watch(self: HookRegistry, stop: asyncio.Event) -> None:
        watching.set()
        try:
            await real_watch(self, stop)
        finally:
            events.append("watcher ended")

    monkeypatch.setattr(HookRegistry, "watch", watch)
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(proxy_config(sock_dir, fake), stack)
        await running.proxy.wait_ready(10)
        await asyncio.wait_for(watching.wait(), 10)
        real_stop, real_close = running.proxy.server.stop, running.proxy.backend.close

        async def server_stop(grace: float | None) -> None:
            await real_stop(grace)
            events.append("server stopped")

        async def backend_close() -> None:
            events.append("channels closing")
            await real_close()

        monkeypatch.setattr(running.proxy.server, "stop", server_stop)
        monkeypatch.setattr(running.proxy.backend, "close", backend_close)
    assert events == ["server stopped", "watcher ended", "channels closing"]
