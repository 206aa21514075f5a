"""The `runtime-proxy serve` process: start-up, stop signals, socket clean-up."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path

import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from tests.subprocs import stderr_within

from .fakes import FakeBackend


async def wait_for_line(stream: asyncio.StreamReader, needle: str, timeout: float = 20) -> list[str]:
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"process ended before {needle!r}: {seen}")
            seen.append(line)
            if needle in line:
                return seen


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_serve_answers_then_a_stop_signal_removes_socket(fake: FakeBackend, sock_dir: Path, stop: signal.Signals) -> None:
    """SIGHUP too (a closed terminal, `kill -HUP`): its default action would end
    the proxy with no clean-up, leaving its socket (and a private containerd) behind."""
    listen = sock_dir / "proxy.sock"
    hook_dir = sock_dir / "hooks"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy.cli", "serve",
        "--listen", str(listen), "--backend", str(fake.socket), "--hook-dir", str(hook_dir),
        "--log-format", "json", stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        lines = await wait_for_line(process.stderr, "serving v1 (native), v1alpha2 (native)")
        assert any('"msg": "listening"' in line for line in lines)
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            reply = await channel.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=10)
        assert v1.VersionResponse.FromString(reply).runtime_name == "fake"
        process.send_signal(stop)
        rest = (await asyncio.wait_for(process.stderr.read(), 20)).decode()
        assert await asyncio.wait_for(process.wait(), 20) == 0
        # One line (before, two: `stop signal received`, then `signal received, shutting down`).
        (signalled,) = [line for line in rest.splitlines() if "signal received" in line]
        assert f'"msg": "signal received, shutting down", "signal": "{stop.name}"' in signalled
        assert '"msg": "stopped"' in rest
        assert not listen.exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_bad_config_file_is_a_clear_error(sock_dir: Path) -> None:
    bad = sock_dir / "config.yaml"
    bad.write_text("listen: [unclosed\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy.cli", "serve", "--config", str(bad),
        stderr=asyncio.subprocess.PIPE,
    )
    err = await stderr_within(process, 20)
    assert process.returncode != 0
    assert str(bad) in err.decode()


async def test_started_with_hangups_ignored_serve_keeps_ignoring_them(fake: FakeBackend, sock_dir: Path) -> None:
    """As under `nohup`: the terminal closing must not stop it (nor, with
    --local-containerd, its containerd and pods)."""
    listen = sock_dir / "proxy.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy.cli", "serve",
        "--listen", str(listen), "--backend", str(fake.socket), "--hook-dir", str(sock_dir / "hooks"),
        "--log-format", "json", stderr=asyncio.subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    try:
        assert process.stderr is not None
        await wait_for_line(process.stderr, "serving v1 (native), v1alpha2 (native)")
        process.send_signal(signal.SIGHUP)  # ignored by the kernel at once: no handler to run later
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            reply = await channel.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=10)
        assert v1.VersionResponse.FromString(reply).runtime_name == "fake"
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stderr.read(), 20)).decode()
        assert await asyncio.wait_for(process.wait(), 20) == 0
        assert '"signal": "SIGTERM"' in rest and "SIGHUP" not in rest
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_metrics_address_serve_cannot_bind_is_one_clear_line(fake: FakeBackend, sock_dir: Path) -> None:
    with socket.socket() as taken:  # another process serves on that port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtimeproxy.cli", "serve",
            "--listen", str(sock_dir / "proxy.sock"), "--backend", str(fake.socket),
            "--hook-dir", str(sock_dir / "hooks"), "--metrics-listen", address, stderr=asyncio.subprocess.PIPE,
        )
        err = await stderr_within(process, 20)
    assert process.returncode == 1, err.decode()
    assert f"metrics-listen '{address}': cannot serve there" in err.decode()
    assert "Traceback" not in err.decode()
