"""LocalContainerd.start against fake containerds: one that serves but whose
CRI plugin never gets ready (the error says what start-up was waiting for,
since containerd's own log may end at "successfully booted"), and one that
loses its listener on the first start, as containerd 1.7.13 may while it
starts NRI plugins (started once more). And a base directory that is not
ours (another run holds it, or a containerd we did not start serves its
socket): start() refuses at once and stop() leaves it alone."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtimeproxy.host.containerd import LocalContainerd, LocalRuntimeError

# Stands in for `containerd --config DIR/containerd.toml`: serves gRPC on
# DIR/containerd.sock, and answers CRI Version as containerd's CRI plugin
# does before it is initialised.
NEVER_READY = """\
import asyncio, sys
from pathlib import Path
import grpc
from grpc import aio

class NotInitialised(grpc.GenericRpcHandler):
    def service(self, details):
        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNKNOWN, "server is not initialized yet")
        return grpc.unary_unary_rpc_method_handler(refuse)

async def main():
    socket = Path(sys.argv[2]).parent / "containerd.sock"
    server = aio.server()
    server.add_generic_rpc_handlers((NotInitialised(),))
    server.add_insecure_port(f"unix:{socket}")  # not unix://: grpc would bind ///PATH
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
"""


async def test_start_names_the_call_it_waited_for(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "containerd"
    fake.write_text(f"#!{sys.executable}\n{NEVER_READY}")
    fake.chmod(0o755)
    runtime = LocalContainerd(tmp_path / "c", bin_dir=bin_dir, snapshotter="native")
    with pytest.raises(LocalRuntimeError) as failure:
        await runtime.start(timeout=3.0, images=False)
    assert "not ready within 3.0s (waiting for CRI Version, last answered UNKNOWN: server is not initialized yet)" in str(
        failure.value
    )
    assert runtime.pid is None  # stopped on the way out


# Its first start says it booted with its socket file left and nobody listening
# (what containerd 1.7.13 shows when it closed its own listener); the next one serves.
LISTENER_LOST_ONCE = """\
import asyncio, socket, sys
from pathlib import Path
import grpc
from grpc import aio

class Answers(grpc.GenericRpcHandler):
    def service(self, details):
        async def answer(request, context):
            return b""
        return grpc.unary_unary_rpc_method_handler(answer)

async def main():
    base = Path(sys.argv[2]).parent
    starts = base / "starts"
    starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
    path = base / "containerd.sock"
    path.unlink(missing_ok=True)
    if len(starts.read_text()) == 1:
        lost = socket.socket(socket.AF_UNIX)
        lost.bind(str(path))
        lost.close()
        print("msg=\\"containerd successfully booted in 0.1s\\"", flush=True)
        await asyncio.Event().wait()
    server = aio.server()
    server.add_generic_rpc_handlers((Answers(),))
    server.add_insecure_port(f"unix:{path}")  # as above
    await server.start()
    print("msg=\\"containerd successfully booted in 0.1s\\"", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def _fake_containerd(tmp_path: Path, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "containerd"
    fake.write_text(f"#!{sys.executable}\n{script}")
    fake.chmod(0o755)
    return bin_dir


async def test_a_start_that_lost_its_listener_is_made_again_with_nri(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bin_dir = _fake_containerd(tmp_path, LISTENER_LOST_ONCE)
    runtime = LocalContainerd(tmp_path / "c", bin_dir=bin_dir, snapshotter="native", nri=True)
    with caplog.at_level(logging.WARNING, logger="runtimeproxy.host.containerd"):
        await runtime.start(timeout=10.0, images=False)
    try:
        assert (runtime.base / "starts").read_text() == "xx"
        assert runtime.pid is not None
        (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "lost a listening socket" in warning.getMessage() and "containerd/nri#66" in warning.getMessage()
        assert "refused connections" in warning.error
    finally:
        await runtime.stop()


async def test_without_nri_a_refusing_containerd_is_not_started_again(tmp_path: Path) -> None:
    bin_dir = _fake_containerd(tmp_path, LISTENER_LOST_ONCE)
    runtime = LocalContainerd(tmp_path / "c", bin_dir=bin_dir, snapshotter="native")
    with pytest.raises(LocalRuntimeError) as failure:
        await runtime.start(timeout=2.0, images=False)
    assert "waiting for CRI Version, last answered UNAVAILABLE" in str(failure.value)
    assert "Connection refused" in str(failure.value)
    assert (runtime.base / "starts").read_text() == "x"


# Stands in for a containerd that must not be started: it leaves a mark.
MUST_NOT_RUN = """\
import sys
from pathlib import Path
(Path(sys.argv[2]).parent / "ran").write_text("containerd was started")
sys.exit(3)
"""


@pytest.fixture
async def foreign_shim(tmp_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process that looks like a shim of a containerd on ``tmp_path/c/containerd.sock``
    (shim_pids finds shims by their name and ``-address``): one another run started."""
    socket_path = tmp_path / "c" / "containerd.sock"
    shim = await asyncio.create_subprocess_exec(
        "bash", "-c",
        'exec -a containerd-shim-runc-v2 "$0" -c "import time; print(flush=True); time.sleep(120)" -address "$1"',
        sys.executable, str(socket_path), stdout=asyncio.subprocess.PIPE)
    try:
        assert shim.stdout is not None
        await asyncio.wait_for(shim.stdout.readline(), 10)  # exec-ed: it has the shim's name now
        yield shim
    finally:
        if shim.returncode is None:
            shim.kill()
        await shim.wait()


async def _still_running(proc: asyncio.subprocess.Process) -> bool:
    await asyncio.sleep(0.2)  # what stop() sent it would have ended it by now
    return proc.returncode is None


async def test_stop_of_a_runtime_that_never_started_touches_nothing(
    tmp_path: Path, foreign_shim: asyncio.subprocess.Process
) -> None:
    from runtimeproxy.host.process import shim_pids

    runtime = LocalContainerd(tmp_path / "c", snapshotter="native")
    assert shim_pids(runtime.socket) == [foreign_shim.pid]
    await runtime.stop()
    assert await _still_running(foreign_shim)


async def test_a_directory_another_run_holds_is_refused_before_anything_starts(
    tmp_path: Path, foreign_shim: asyncio.subprocess.Process
) -> None:
    from runtimeproxy.host.dirlock import DirectoryLock

    base = tmp_path / "c"
    base.mkdir()
    held = DirectoryLock.acquire(base)  # the other run (here: this process, another open file)
    try:
        runtime = LocalContainerd(base, bin_dir=_fake_containerd(tmp_path, MUST_NOT_RUN), snapshotter="native")
        with pytest.raises(LocalRuntimeError) as failure:
            await runtime.start(timeout=5.0, images=False)
        assert f"{base} is in use by another runtime-proxy (pid {os.getpid()}," in str(failure.value)
        assert not (base / "ran").exists()
        assert not runtime.config_path.exists()  # nothing under base was written
        await runtime.stop()  # nothing of it is ours
        assert await _still_running(foreign_shim)
    finally:
        held.release()


async def test_a_containerd_we_did_not_start_on_the_socket_is_refused(
    tmp_path: Path, foreign_shim: asyncio.subprocess.Process
) -> None:
    base = tmp_path / "c"
    base.mkdir()
    # Left by a run that was killed with SIGKILL: its containerd (a new session) serves on.
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(base / "containerd.sock"))
        left.listen()
        runtime = LocalContainerd(base, bin_dir=_fake_containerd(tmp_path, MUST_NOT_RUN), snapshotter="native")
        with pytest.raises(LocalRuntimeError) as failure:
            await runtime.start(timeout=5.0, images=False)
        assert f"{base / 'containerd.sock'} is served by a containerd this run did not start" in str(failure.value)
        assert not (base / "ran").exists()
        await runtime.stop()
        assert await _still_running(foreign_shim)
    # The lock went with the failed start: the directory is free for the next run.
    from runtimeproxy.host.dirlock import DirectoryLock

    DirectoryLock.acquire(base).release()


@pytest.mark.parametrize("base", ["file", "file/c"], ids=["a regular file", "below a regular file"])
async def test_a_directory_that_cannot_be_made_is_one_line_of_error(tmp_path: Path, base: str) -> None:
    """serve logs a LocalRuntimeError in one line; an OSError came with a traceback."""
    (tmp_path / "file").write_text("precious")
    runtime = LocalContainerd(tmp_path / base, bin_dir=_fake_containerd(tmp_path, MUST_NOT_RUN), snapshotter="native")
    with pytest.raises(LocalRuntimeError, match=f"^cannot use {tmp_path / base} as containerd's directory: "):
        await runtime.start(timeout=5.0, images=False)
    assert (tmp_path / "file").read_text() == "precious"
    await runtime.stop()  # nothing of it is ours


async def test_a_failed_start_releases_the_directory(tmp_path: Path) -> None:
    runtime = LocalContainerd(tmp_path / "c", bin_dir=_fake_containerd(tmp_path, MUST_NOT_RUN), snapshotter="native")
    with pytest.raises(LocalRuntimeError, match="exited with status 3"):
        await runtime.start(timeout=5.0, images=False)
    from runtimeproxy.host.dirlock import DirectoryLock

    DirectoryLock.acquire(runtime.base).release()


async def test_a_failed_clean_up_step_does_not_skip_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """runc missing or hung: the shims are still stopped and the mounts still unmounted."""
    runtime = LocalContainerd(tmp_path / "c", snapshotter="native")
    done: list[str] = []

    async def fails(runc_root: Path) -> None:
        raise FileNotFoundError("runc")

    async def unmount(base: Path, own: tuple[Path, ...], before: frozenset[int]) -> None:
        done.append("unmount")

    async def shims(pids: list[int], grace: float) -> None:
        done.append("shims")

    monkeypatch.setattr("runtimeproxy.host.containerd.delete_runc_containers", fails)
    monkeypatch.setattr("runtimeproxy.host.containerd.unmount_new_under", unmount)
    monkeypatch.setattr("runtimeproxy.host.containerd.terminate_pids", shims)
    await runtime._shutdown(grace=0.1)
    assert done == ["shims", "unmount"]
    [failed] = [r for r in caplog.records if r.getMessage().startswith("local containerd clean-up step failed")]
    assert failed.step == "delete runc containers" and "runc" in failed.error
