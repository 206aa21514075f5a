"""`runtime-proxy nri --metrics-listen` against a fake runtime: a metrics
address it cannot serve on ends the plugin before it registers; one
listener however often the plugin reconnects."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from runtimeproxy.metricshttp import MetricsListener
from tests.subprocs import stderr_within

from .fakeruntime import FakeRuntime

REPO = Path(__file__).resolve().parents[3]


async def test_a_metrics_port_in_use_ends_the_plugin_before_it_registers(runtime: FakeRuntime, hook_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtimeproxy.cli", "nri", "--hook-dir", str(hook_dir),
            "--nri-socket", str(runtime.path), "--metrics-listen", address, "--log-format", "json",
            cwd=REPO, stderr=asyncio.subprocess.PIPE)  # fmt: skip
        log = (await stderr_within(process, 30)).decode()
    assert process.returncode == 1, log
    (fatal,) = [line for line in map(json.loads, log.splitlines()) if line["msg"] == "fatal"]
    assert fatal["error"] == f"metrics-listen '{address}': cannot serve there: Address already in use (EADDRINUSE)"
    assert "Traceback" not in log
    assert runtime.links.empty()  # it never connected: no RegisterPlugin


async def test_a_reconnect_to_the_runtime_does_not_serve_metrics_again(
    runtime: FakeRuntime, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    listeners: list[MetricsListener] = []
    real_start = MetricsListener.start
    monkeypatch.setattr(MetricsListener, "start", lambda self: listeners.append(self) or real_start(self))
    plugin, link = await connect(metrics_listen="127.0.0.1:0")
    await runtime.stop()  # containerd restarts: the plugin connects again
    await link.closed.wait()
    await runtime.start()
    again = await runtime.next_link()
    await again.handshake()
    assert again.registered.result().plugin_name == plugin.identity.name
    (listener,) = listeners  # the first connection's, still serving
    assert listener.server is not None and not listener.done.is_set()
    port = listener.server.server_port

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return answer.read().decode()

    assert "runtime_proxy_hook_servers 0.0" in await asyncio.to_thread(scrape)
