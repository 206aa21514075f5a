"""Hook files added, changed and removed while calls run, and the metrics
endpoint that reports them."""

from __future__ import annotations

import asyncio
import contextlib
import time

from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.hookpath.points import HookType

from ...hookprocs import hook_server, registered, reloaded_until
from .crirequests import CREATE, QUOTA_HOOK, backend_request, create_request


async def test_live_add_change_delete(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        path = hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert backend_request(fake).config.linux.resources.cpu_quota == 20000
        # Change: it no longer registers for PreCreateContainer.
        hook.register(hook_dir, ["PreStartContainer"])
        await reloaded_until(running, lambda: not running.registry.servers_for(HookType.PRE_CREATE_CONTAINER))
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert backend_request(fake).config.linux.resources.cpu_quota == 0
        path.unlink()
        await registered(running, 0)


async def test_removing_a_hook_mid_call_does_not_hang_the_call(running, fake, client, sock_dir, hook_dir) -> None:
    slow = {"PreCreateContainer": {"container_resources": {"cpu_quota": 7000}, "delay": 0.5}}
    async with hook_server(sock_dir, "slow", slow) as hook:
        path = hook.register(hook_dir, ["PreCreateContainer"], "Ignore", timeout="2s")
        await registered(running, 1)
        call = asyncio.ensure_future(client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10))
        await hook.received("PreCreateContainer")
        path.unlink()
        await registered(running, 0)
        started = time.monotonic()
        await asyncio.wait_for(call, 3)
        assert time.monotonic() - started < 2.0
    assert backend_request(fake).config.linux.resources.cpu_quota == 7000  # the call under way finished


async def test_metrics_endpoint(fake, sock_dir, hook_dir) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir, metrics_listen=f"127.0.0.1:{port}")
    fake.script(CREATE, response=v1.CreateContainerResponse(container_id="ctr-9").SerializeToString())
    async with contextlib.AsyncExitStack() as stack, hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
            await channel.unary_unary(CREATE)(create_request().SerializeToString())
        def scrape() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

        text = await asyncio.to_thread(scrape)
        # The runtime goes away: readiness drops until it is back and probed again.
        lost, back = asyncio.Event(), asyncio.Event()
        running.proxy.backend.on_lost(lost.set)
        running.proxy.backend.on_change(lambda info: back.set())
        await fake.stop()
        await asyncio.wait_for(lost.wait(), 15)
        assert "runtime_proxy_backend_ready 0.0" in await asyncio.to_thread(scrape)
        await fake.start()
        await asyncio.wait_for(back.wait(), 15)
        assert "runtime_proxy_backend_ready 1.0" in await asyncio.to_thread(scrape)
    assert "runtime_proxy_backend_ready 1.0" in text
    assert "runtime_proxy_hook_servers 1.0" in text
    assert 'runtime_proxy_hook_calls_total{hook="PreCreateContainer",outcome="ok",server="quota.json"} 1.0' in text
    assert 'runtime_proxy_hooked_calls_total{method="CreateContainer",outcome="ok"} 1.0' in text
