"""README's run command: a proxy in front of a private containerd it starts itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from grpc import aio

from runtimeproxy.host.images import BUSYBOX_IMAGE, PAUSE_IMAGE
from runtimeproxy.host.process import _wait_pid_gone, mounts_under, shim_pids, terminate_process

from ..component.test_process import wait_for_line
from .conftest import require_local_containerd
from .crihelpers import APIS, V1
from .test_localruntime import start_sleeper


# SIGHUP as well: a closed terminal must not leave the private containerd behind.
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
async def test_serve_with_local_containerd(stop_signal: signal.Signals) -> None:
    require_local_containerd()
    base = Path(tempfile.mkdtemp(prefix="rpl-", dir="/tmp"))
    listen = base / "proxy.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "serve",
        "--local-containerd", str(base / "containerd"), "--listen", str(listen), "--hook-dir", str(base / "hooks"),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        lines = await wait_for_line(process.stderr, "serving v1 (native), v1alpha2 (native)", timeout=90)
        assert any(f"crictl --runtime-endpoint unix://{listen}" in line for line in lines)
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            for api in APIS:
                version = await api.runtime(channel).Version(api.pb.VersionRequest(), timeout=10)
                assert (version.runtime_name, version.runtime_api_version) == ("containerd", api.version)
                listed = await api.images(channel).ListImages(api.pb.ListImagesRequest(), timeout=10)
                assert {BUSYBOX_IMAGE, PAUSE_IMAGE} <= {tag for image in listed.images for tag in image.repo_tags}
        process.send_signal(stop_signal)
        rest = (await asyncio.wait_for(process.stderr.read(), 60)).decode()
        assert await asyncio.wait_for(process.wait(), 60) == 0
        assert f"signal={stop_signal.name}" in rest and "containerd stopped" in rest
        assert not listen.exists()
        containerd_socket = base / "containerd" / "containerd.sock"
        assert not containerd_socket.exists()  # containerd shut down, not orphaned
        assert shim_pids(containerd_socket) == []
        assert mounts_under(base) == []
    finally:
        # SIGTERM first: the proxy stops its private containerd then (SIGKILL would orphan it).
        await terminate_process(process, 60, "runtime-proxy serve")
        shutil.rmtree(base, ignore_errors=True)


async def test_a_stop_with_pods_to_clean_up_writes_only_log_lines_to_stderr() -> None:
    """uvloop starts each child (the clean-up's runc and umount) with fork(),
    which ran grpc's fork handlers: with grpc's threads busy they wrote
    `fork_posix.cc:71] Other threads are currently calling into gRPC, skipping
    fork() handlers` to stderr, a line that is not JSON."""
    require_local_containerd()
    base = Path(tempfile.mkdtemp(prefix="rpl-", dir="/tmp"))
    listen = base / "proxy.sock"
    # Not a value from outside (it would win): the one serve's entry point sets.
    env = {name: value for name, value in os.environ.items() if name != "GRPC_ENABLE_FORK_SUPPORT"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "serve", "--local-containerd", str(base / "containerd"),
        "--listen", str(listen), "--hook-dir", str(base / "hooks"), "--log-format", "json", "--event-loop", "uvloop",
        stderr=asyncio.subprocess.PIPE, env=env)
    try:
        assert process.stderr is not None
        await wait_for_line(process.stderr, "serving v1 (native), v1alpha2 (native)", timeout=90)
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            for _ in range(3):  # runc containers and mounts for the stop to clean up
                await start_sleeper(V1, channel, base / "pod-logs")
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stderr.read(), 60)).decode()
        assert await asyncio.wait_for(process.wait(), 60) == 0, rest
        assert [line for line in rest.splitlines() if not line.startswith("{")] == []
        assert [json.loads(line)["msg"] for line in rest.splitlines()][-1] == "containerd stopped"
    finally:
        await terminate_process(process, 60, "runtime-proxy serve")
        shutil.rmtree(base, ignore_errors=True)


async def test_a_proxy_killed_outright_takes_its_private_containerd_with_it() -> None:
    """SIGKILL leaves the proxy no chance to stop containerd: the kernel sends
    containerd SIGTERM (setpriv --pdeathsig) rather than leave it serving."""
    require_local_containerd()
    base = Path(tempfile.mkdtemp(prefix="rpl-", dir="/tmp"))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "serve", "--local-containerd", str(base / "containerd"),
        "--listen", str(base / "proxy.sock"), "--hook-dir", str(base / "hooks"), stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stderr is not None
        await wait_for_line(process.stderr, "serving v1 (native), v1alpha2 (native)", timeout=90)
        containerd = _containerd_pid(base)
        process.kill()
        await process.wait()
        assert await _wait_pid_gone(containerd, 30), "the private containerd outlived its proxy"
    finally:
        await _cleaned_up(process, base)


async def test_a_private_containerd_killed_ends_serve_in_order_with_its_signal_and_log() -> None:
    """The proxy owns that containerd and does not restart it: before, it
    served on, logging `backend unavailable` for ever."""
    require_local_containerd()
    base = Path(tempfile.mkdtemp(prefix="rpl-", dir="/tmp"))
    listen = base / "proxy.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "serve", "--local-containerd", str(base / "containerd"),
        "--listen", str(listen), "--hook-dir", str(base / "hooks"), "--log-format", "json",
        stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stderr is not None
        await wait_for_line(process.stderr, "serving v1 (native), v1alpha2 (native)", timeout=90)
        containerd_socket = base / "containerd" / "containerd.sock"
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            await start_sleeper(V1, channel, base / "pod-logs")  # a shim for the clean-up to stop
        assert shim_pids(containerd_socket) != []
        containerd = _containerd_pid(base)
        os.kill(containerd, signal.SIGKILL)
        rest = (await asyncio.wait_for(process.stderr.read(), 60)).decode()
        assert await asyncio.wait_for(process.wait(), 60) == 1, rest
        lines = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
        messages = [line["msg"] for line in lines]
        exited = messages.index("shutting down: the private containerd exited")
        assert (lines[exited]["pid"], lines[exited]["status"]) == (containerd, "killed by SIGKILL")
        # the proxy stops serving, then the containerd's clean-up runs
        assert exited < messages.index("stopped") < messages.index("containerd stopped")
        (fatal,) = [line["error"] for line in lines if line["msg"] == "fatal"]
        assert fatal.startswith(f"the private containerd (pid {containerd}) exited: killed by SIGKILL; "
                                "it is not restarted, restart runtime-proxy serve")
        assert "level=" in fatal.partition("containerd.log ends:\n")[2]  # containerd's own last lines
        assert "Traceback" not in rest
        assert not listen.exists()
        assert shim_pids(containerd_socket) == []  # the shims it left are stopped
        assert mounts_under(base) == []
    finally:
        await _cleaned_up(process, base)


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _containerd_pid(base: Path) -> int:
    """The private containerd's own pid (not its setpriv wrapper's)."""
    config = str(base / "containerd" / "containerd.toml")
    [containerd] = [pid for pid in _pids() if config in _cmdline(pid) and "setpriv" not in _cmdline(pid)]
    return containerd


async def _cleaned_up(process: asyncio.subprocess.Process, base: Path) -> None:
    """serve stopped (SIGTERM first), whatever else runs from ``base`` killed
    (what a failure left behind), and ``base`` removed."""
    await terminate_process(process, 60, "runtime-proxy serve")
    for pid in [pid for pid in _pids() if str(base) in _cmdline(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


async def test_a_second_serve_on_the_same_directory_fails_and_leaves_the_first_alone() -> None:
    """The same command twice (say, in two terminals): the second must fail at
    once, never reach the first's containerd nor stop its pods on the way out."""
    require_local_containerd()
    base = Path(tempfile.mkdtemp(prefix="rpl-", dir="/tmp"))
    listen = base / "proxy.sock"
    argv = (sys.executable, "-m", "runtimeproxy", "serve", "--local-containerd", str(base / "containerd"),
            "--listen", str(listen), "--hook-dir", str(base / "hooks"))
    first = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
    second: asyncio.subprocess.Process | None = None
    try:
        assert first.stderr is not None
        await wait_for_line(first.stderr, "serving v1 (native), v1alpha2 (native)", timeout=90)
        containerd_socket = base / "containerd" / "containerd.sock"
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            pod_id, _ = await start_sleeper(V1, channel, base / "pod-logs")
            shims = sorted(shim_pids(containerd_socket))
            second = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(second.communicate(), 30)
            assert second.returncode == 1, err.decode()
            assert f"{base / 'containerd'} is in use by another runtime-proxy (pid {first.pid}," in err.decode()
            assert "containerd started" not in err.decode()
            assert "Traceback" not in err.decode()  # an operator's mistake, said in one line
            status = await V1.runtime(channel).PodSandboxStatus(
                V1.pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10)
            assert status.status.state == V1.pb.SANDBOX_READY
            assert sorted(shim_pids(containerd_socket)) == shims
        assert listen.exists()  # the first still serves
        first.send_signal(signal.SIGTERM)
        await asyncio.wait_for(first.stderr.read(), 60)
        assert await asyncio.wait_for(first.wait(), 60) == 0
        assert shim_pids(containerd_socket) == []  # the first stopped its own pods
        assert mounts_under(base) == []
    finally:
        if second is not None:
            await terminate_process(second, 60, "second runtime-proxy serve")
        await terminate_process(first, 60, "runtime-proxy serve")
        shutil.rmtree(base, ignore_errors=True)
