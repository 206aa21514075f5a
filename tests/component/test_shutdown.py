"""The proxy's stop, in order: stop accepting, drain calls, finish recording,
stop the watcher and the rebuild, then close the channels."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import build_proxy
from runtimeproxy.cripath import server
from runtimeproxy.config import ProxyConfig
from runtimeproxy.hookpath.registry import HookRegistry

from ..hookprocs import hook_server, registered
from .fakes import FakeBackend
from .test_process import wait_for_line

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
    caplog.set_level(logging.DEBUG, logger="runtimeproxy")  # not grpc's: its debug records hold core objects that may be gone when formatted
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
            events.append("server stopped again" if "server stopped" in events else "server stopped")

        async def backend_close() -> None:
            events.append("channels closing")
            await real_close()

        monkeypatch.setattr(running.proxy.server, "stop", server_stop)
        monkeypatch.setattr(running.proxy.backend, "close", backend_close)
    # The stop's end stops grpc once more before the socket and its lock go
    # (socketlock.release_once_stopped): a no-op after a stop that finished.
    assert events == ["server stopped", "watcher ended", "channels closing", "server stopped again"]


LIST = "/runtime.v1.RuntimeService/ListContainers"
ROUNDS = 6  # before the fix, most SIGTERMs under this load ended a call CANCELLED
CLIENTS = 4
WARM_CALLS = 20  # answered calls in a round before the SIGTERM


async def test_calls_during_sigterm_end_ok_or_unavailable_never_cancelled(fake, sock_dir) -> None:
    """`serve` (metrics on) under clients looping unary calls, stopped by
    SIGTERM: every call is answered or refused UNAVAILABLE, none CANCELLED.
    A process per round: one stop per process, as in production."""
    outcomes: Counter[str] = Counter()
    listen = sock_dir / "proxy.sock"
    for _ in range(ROUNDS):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtimeproxy.cli", "serve", "--listen", str(listen), "--backend", str(fake.socket),
            "--hook-dir", str(sock_dir / "hooks.d"), "--metrics-listen", "127.0.0.1:0", "--log-format", "json",
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            await wait_for_line(process.stderr, "serving v1 (native)")
            answered = 0
            warm, stopping = asyncio.Event(), asyncio.Event()

            async def client(warm: asyncio.Event, stopping: asyncio.Event) -> None:  # this round's
                nonlocal answered
                async with aio.insecure_channel(f"unix://{listen}") as channel:
                    call = channel.unary_unary(LIST)
                    for _ in range(20000):  # bounded; a client ends at its first refusal after SIGTERM
                        try:
                            await call(b"", timeout=10)
                            outcomes["OK"] += 1
                            answered += 1
                            if answered >= WARM_CALLS:
                                warm.set()
                        except aio.AioRpcError as err:
                            outcomes[err.code().name] += 1
                            if stopping.is_set():
                                return

            clients = [asyncio.ensure_future(client(warm, stopping)) for _ in range(CLIENTS)]
            await asyncio.wait_for(warm.wait(), 20)
            stopping.set()
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(asyncio.gather(*clients), 30)
            await asyncio.wait_for(process.stderr.read(), 30)
            assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert set(outcomes) == {"OK", "UNAVAILABLE"}, outcomes
    assert outcomes["UNAVAILABLE"] >= CLIENTS * ROUNDS


async def test_a_stop_with_metrics_does_not_wait_for_the_metrics_server(
    fake, sock_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics server's thread notices a shutdown only at its next poll
    (0.5 s by default); the stop must not wait for it on the event loop. The
    poll is made 20 s here, so that a stop that waits is unmistakable; the
    bound below is generous for a loaded machine and far below the poll."""
    from prometheus_client.exposition import ThreadingWSGIServer

    real_serve = ThreadingWSGIServer.serve_forever

    def serve_forever(self: ThreadingWSGIServer, poll_interval: float = 0.5) -> None:
        real_serve(self, poll_interval=20)

    monkeypatch.setattr(ThreadingWSGIServer, "serve_forever", serve_forever)
    stack = contextlib.AsyncExitStack()
    running = await build_proxy(proxy_config(sock_dir, fake, metrics_listen="127.0.0.1:0"), stack)
    await running.proxy.wait_ready(10)
    started = time.monotonic()
    await stack.aclose()
    assert time.monotonic() - started < 10


async def test_a_hanging_post_hook_holds_the_stop_only_briefly_past_the_grace(
    fake, sock_dir, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A post hook may take its whole timeout (up to 120 s, more when chained);
    # the unit's stop timeout (20 s) would SIGKILL the rest of the stop.
    monkeypatch.setattr(server, "SETTLE_AFTER_GRACE_S", 0.5)
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    config = proxy_config(sock_dir, fake, grace_period=0.2)
    async with hook_server(sock_dir, "slow", {"PostStartContainer": {"delay": 60}}) as hook:
        hook.register(config.hook_dir, ["PostStartContainer"], failure_policy="Ignore", timeout="60s")
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            await running.proxy.wait_ready(10)
            await registered(running, 1)
            store = running.hooks.store  # a container the proxy knows, as if it had seen its creation
            store.put_pod("pod-1", hookapi.PodSandboxHookRequest())
            store.put_container("ctr-1", "pod-1", hookapi.ContainerResourceHookRequest())
            async with aio.insecure_channel(f"unix://{config.listen}") as channel:
                await channel.unary_unary("/runtime.v1.RuntimeService/StartContainer")(
                    v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
            await hook.received("PostStartContainer")  # the post hook is under way, and hangs
            stopping = time.monotonic()
        took = time.monotonic() - stopping
    assert took < 0.2 + 0.5 + 2.0, took  # not the hook's 60 s
    warned = [r for r in caplog.records if r.getMessage().startswith("post hooks or records still running at shutdown")]
    assert len(warned) == 1 and warned[0].tasks, caplog.text
    assert "stopped" in [r.getMessage() for r in caplog.records]
