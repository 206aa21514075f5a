"""Issue 12: per-method CRI metrics, scraped over HTTP after a scripted
lifecycle through the proxy (fake backend, a real hook-server process)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from hooks.sdk import write_hook_config
from runtimeproxy.app import RunningProxy, build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath import methods

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend

V1 = "/runtime.v1.RuntimeService/"
V1A2 = "/runtime.v1alpha2.RuntimeService/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def calls(samples: dict[str, float], method: str, version: str, code: str) -> float:
    return samples.get(f'runtime_proxy_cri_calls_total{{code="{code}",method="{method}",version="{version}"}}', 0.0)


@pytest.fixture
def hook_dir(sock_dir: Path) -> Path:
    path = sock_dir / "hooks.d"
    path.mkdir(mode=0o755)
    return path


async def test_calls_counted_by_method_version_and_code(fake: FakeBackend, sock_dir: Path, hook_dir: Path) -> None:
    port = free_port()
    config = ProxyConfig(
        listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=hook_dir, metrics_listen=f"127.0.0.1:{port}"
    )
    fake.script(V1 + "RunPodSandbox", response=v1.RunPodSandboxResponse(pod_sandbox_id="pod-1").SerializeToString())
    fake.script(V1 + "StartContainer", code=grpc.StatusCode.NOT_FOUND, details="no such container")
    hang = V1 + "ContainerStatus"
    fake.script(hang, hang=True)
    failing = {"PreCreateContainer": {"behaviour": "error", "message": "policy engine says no"}}
    async with contextlib.AsyncExitStack() as stack, hook_server(sock_dir, "veto", failing) as hook:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        hook.register(hook_dir, ["PreCreateContainer"], "Fail")
        # A second one nobody serves, whose failure is ignored.
        write_hook_config(hook_dir, "gone", sock_dir / "nobody.sock", ["PreRunPodSandbox"], "Ignore", "500ms")
        await registered(running, 2)
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
            await channel.unary_unary(V1 + "Version")(b"")
            await channel.unary_unary(V1A2 + "Version")(b"")
            await channel.unary_unary(V1 + "RunPodSandbox")(b"")
            for _ in range(2):
                with pytest.raises(aio.AioRpcError) as err:
                    await channel.unary_unary(V1 + "StartContainer")(b"")
                assert err.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(aio.AioRpcError) as err:
                await channel.unary_unary(V1 + "CreateContainer")(
                    v1.CreateContainerRequest(pod_sandbox_id="pod-1").SerializeToString()
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # A server stream and a call still in flight while scraped.
            fake.script(V1 + "GetContainerEvents", stream=[b"", b""])
            assert len([m async for m in channel.unary_stream(V1 + "GetContainerEvents")(b"")]) == 2
            pending = asyncio.ensure_future(channel.unary_unary(hang)(b""))
            await fake.wait_calls(hang)
            during = await asyncio.to_thread(scrape, port)
            fake.scripts[hang].release.set()
            await pending
            # A client that gives up: its call is counted CANCELLED (or DEADLINE_EXCEEDED, see below).
            fake.script(hang, hang=True)
            with pytest.raises(aio.AioRpcError) as err:
                await channel.unary_unary(hang)(b"", timeout=0.3)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # The client gave up first: the proxy counts the call once its
            # handler has noticed, which it shows by nothing left in flight.
            async with asyncio.timeout(10):
                while (after := await asyncio.to_thread(scrape, port))["runtime_proxy_cri_calls_in_flight"] != 0.0:  # noqa: ASYNC110 - read over HTTP, no event; bounded
                    await asyncio.sleep(0.05)

    assert during["runtime_proxy_cri_calls_in_flight"] == 1.0
    assert calls(after, "Version", "v1", "OK") == 1
    assert calls(after, "Version", "v1alpha2", "OK") == 1
    assert calls(after, "RunPodSandbox", "v1", "OK") == 1
    assert calls(after, "StartContainer", "v1", "NOT_FOUND") == 2
    assert calls(after, "StartContainer", "v1", "OK") == 0
    assert calls(after, "CreateContainer", "v1", "FAILED_PRECONDITION") == 1
    assert calls(after, "GetContainerEvents", "v1", "OK") == 1
    assert calls(after, "ContainerStatus", "v1", "OK") == 1
    # The client's deadline reaches the runtime with the call, so whichever
    # notices first ends it: the client (CANCELLED) or the runtime.
    assert calls(after, "ContainerStatus", "v1", "CANCELLED") + calls(
        after, "ContainerStatus", "v1", "DEADLINE_EXCEEDED"
    ) == 1, {name: value for name, value in after.items() if 'method="ContainerStatus"' in name and "_total" in name}
    assert after["runtime_proxy_cri_calls_in_flight"] == 0.0
    histogram = 'runtime_proxy_cri_call_duration_seconds_count{method="StartContainer",version="v1"}'
    assert after[histogram] == 2
    # Hook failures, by cause: the hook server answered with an error status
    # (the test server's handler raised: INTERNAL), the other one is down.
    hook_outcomes = {
        (re.search(r'server="([^"]+)"', name).group(1), re.search(r'outcome="([^"]+)"', name).group(1)): value  # type: ignore[union-attr]
        for name, value in after.items()
        if name.startswith("runtime_proxy_hook_calls_total{")
    }
    assert hook_outcomes == {("veto.json", "internal"): 1.0, ("gone.json", "unavailable"): 1.0}
    assert after['runtime_proxy_hooked_calls_total{method="CreateContainer",outcome="error"}'] == 1
    # Both versions served natively by a backend that has both.
    assert after['runtime_proxy_served_versions{mode="native",version="v1"}'] == 1
    assert after['runtime_proxy_served_versions{mode="native",version="v1alpha2"}'] == 1


async def test_translated_versions_and_reconnects(sock_dir: Path) -> None:
    port = free_port()
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as fake:
        config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, metrics_listen=f"127.0.0.1:{port}",
                             serve_versions="v1,v1alpha2")
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            await running.proxy.wait_ready(10)
            reconnected = asyncio.Event()
            running.proxy.backend.on_reconnect(lambda restarted: reconnected.set())
            await fake.stop()
            await fake.start()
            await asyncio.wait_for(reconnected.wait(), 15)
            samples = await asyncio.to_thread(scrape, port)
    assert samples['runtime_proxy_served_versions{mode="native",version="v1"}'] == 1
    assert samples['runtime_proxy_served_versions{mode="translated",version="v1alpha2"}'] == 1
    assert samples['runtime_proxy_backend_reconnects_total{kind="restarted"}'] == 1


INVENTED = 300  # each distinct name used to add a counter and a histogram series


def cri_series(running: RunningProxy) -> list[dict[str, str]]:
    """The label sets of every sample of the per-call CRI families."""
    return [
        sample.labels
        for family in running.metrics.registry.collect()
        if family.name in ("runtime_proxy_cri_calls", "runtime_proxy_cri_call_duration_seconds")
        for sample in family.samples
    ]


async def test_invented_methods_are_forwarded_but_counted_under_one_label(fake: FakeBackend, sock_dir: Path) -> None:
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, hook_dir=sock_dir / "no-hooks")
    invented = [f"{V1}Bogus{i}" for i in range(INVENTED)] + [f"/runtime.v1alpha2.ImageService/Bogus{i}" for i in range(INVENTED)]
    # A known name under the service that lacks it is no known method either.
    invented.append("/runtime.v1.ImageService/RunPodSandbox")
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
            await channel.unary_unary(V1 + "Version")(b"")
            for path in invented:
                await channel.unary_unary(path)(b"x")
        series = cri_series(running)
    # Still forwarded unchanged, every one of them.
    assert [r.path for r in fake.received if r.path in set(invented)] == invented
    assert all(r.requests == [b"x"] for r in fake.received if r.path in set(invented))
    known = {info.name for table in methods.METHODS.values() for info in table.values()}
    assert {labels["method"] for labels in series} <= known | {"unknown"}
    assert {labels["version"] for labels in series} <= {"v1", "v1alpha2"}
    totals = {
        (labels["method"], labels["version"]): sample.value
        for family in running.metrics.registry.collect()
        if family.name == "runtime_proxy_cri_calls"
        for sample in family.samples
        if sample.name.endswith("_total")
        for labels in [sample.labels]
    }
    assert totals[("unknown", "v1")] == INVENTED + 1
    assert totals[("unknown", "v1alpha2")] == INVENTED
    assert totals[("Version", "v1")] == 1
    # Two methods (Version, unknown) in two versions: a few dozen samples, not thousands.
    assert len(series) < 100, len(series)
