"""hooks.sdk.run removes the hook files written during it for a server
started during it: as that server stops (before its listener closes), or
as run ends by any path that unwinds, for one never stopped
(hooks/runscope.py). SIGTERM is the script's own business, as before.

Before: a script whose main ended without removing its hook file (an
exception, a cancel, or simply no unlink) left it naming a socket nobody
answered, so a Fail hook refused every call of its hook points; nothing said
so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from hooks import runscope
from hooks.sdk import HookServer, run, write_hook_config


class Hook(HookServer):
    async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
        return None


def _register(server: HookServer, hook_dir: Path, name: str = "h", **kwargs: bool) -> Path:
    return write_hook_config(hook_dir, name, server.socket_path, ["PreCreateContainer"], failure_policy="Fail",
                             **kwargs)


def test_a_hook_file_left_when_main_returns_is_removed_even_without_stop(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "hooks.sdk")

    async def main() -> Path:
        server = Hook(sock_dir / "h.sock")
        await server.start()  # never stopped
        return _register(server, tmp_path)

    path = run(main(), "asyncio")
    assert not path.exists()
    (removed,) = [r for r in caplog.records if "removed" in r.getMessage()]
    assert removed.levelno == logging.INFO and removed.hook_file == str(path)


async def _unstopped(sock_dir: Path, tmp_path: Path, written: list[Path]) -> HookServer:
    server = Hook(sock_dir / "h.sock")
    await server.start()  # never stopped: run's end is all that removes its file
    written.append(await asyncio.to_thread(_register, server, tmp_path))  # from a thread too
    return server


def test_a_hook_file_is_removed_when_main_raises(sock_dir: Path, tmp_path: Path) -> None:
    written: list[Path] = []

    async def main() -> None:
        await _unstopped(sock_dir, tmp_path, written)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run(main(), "asyncio")
    assert written and not written[0].exists()


def test_a_hook_file_is_removed_when_main_is_cancelled(sock_dir: Path, tmp_path: Path) -> None:
    written: list[Path] = []

    async def main() -> None:
        await _unstopped(sock_dir, tmp_path, written)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.Event().wait()

    with pytest.raises(asyncio.CancelledError):
        run(main(), "asyncio")
    assert written and not written[0].exists()


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_hook_file_is_removed_on_ctrl_c(sock_dir: Path, tmp_path: Path, event_loop: str) -> None:
    """SIGINT: the runner cancels main, then raises KeyboardInterrupt."""
    written: list[Path] = []

    async def main() -> None:
        await _unstopped(sock_dir, tmp_path, written)
        signal.raise_signal(signal.SIGINT)
        await asyncio.Event().wait()

    # As Python sets it at start unless it came in ignored (a job a script put
    # in the background): ignored, the signal would leave main waiting forever.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run(main(), event_loop)
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert written and not written[0].exists()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
def test_stop_removes_the_hook_file_before_its_listener_closes_lock_held(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, transport: str
) -> None:
    """As hook run does: the proxy stops calling before the server stops
    answering, and no second server binds the path meanwhile. Before: the
    file went only as run ended, after the server had stopped."""
    caplog.set_level(logging.INFO, "hooks.sdk")
    seen: list[tuple[bool, bool]] = []  # as the listener is told to stop: file there, lock held

    async def main() -> Path:
        server = Hook(sock_dir / "h.sock", transport=transport)
        await server.start()
        path = _register(server, tmp_path)
        listener, lock = server._server, server._path_lock
        assert listener is not None and lock is not None
        stop: Callable[[float | None], Awaitable[None]] = listener.stop

        async def spied(grace: float | None) -> None:
            seen.append((path.exists(), lock.held))
            await stop(grace)

        listener.stop = spied  # type: ignore[method-assign]
        await server.stop()
        assert not path.exists()
        return path

    path = run(main(), "asyncio")
    assert seen[0] == (False, True)
    (removed,) = [r for r in caplog.records if "removed" in r.getMessage()]
    assert removed.getMessage() == f"hook file {path} removed: its server is stopping"


def test_a_hook_file_written_with_remove_with_server_false_stays(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Fail hook that wants calls refused while it is down (koordlet keeps
    its koordlet.json): neither the stop nor run's end removes it, and a
    later write so of a file written before forgets the first."""
    caplog.set_level(logging.INFO, "hooks.sdk")

    async def main() -> tuple[Path, Path]:
        stopped = Hook(sock_dir / "a.sock")
        await stopped.start()
        kept = _register(stopped, tmp_path, "kept", remove_with_server=False)
        await stopped.stop()
        never_stopped = Hook(sock_dir / "b.sock")
        await never_stopped.start()
        _register(never_stopped, tmp_path, "rewritten")
        return kept, _register(never_stopped, tmp_path, "rewritten", remove_with_server=False)

    kept, rewritten = run(main(), "asyncio")
    assert kept.exists() and rewritten.exists()
    assert not [r for r in caplog.records if "removed" in r.getMessage()]


def test_hook_files_not_for_a_server_of_the_run_or_replaced_since_stay(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A script registering a server that runs elsewhere keeps its file, and
    a file another writer has put in place since (a rolling update's new
    instance) is that writer's."""
    caplog.set_level(logging.INFO, "hooks.sdk")
    elsewhere = str(sock_dir / "elsewhere.sock")

    async def main() -> tuple[Path, Path]:
        async with Hook(sock_dir / "h.sock") as server:
            other = write_hook_config(tmp_path, "other", elsewhere, ["PreCreateContainer"])
            mine = _register(server, tmp_path)
            replacement = mine.with_suffix(".new")
            replacement.write_text(mine.read_text())
            os.replace(replacement, mine)
        return other, mine

    other, mine = run(main(), "asyncio")
    assert other.exists() and mine.exists()
    (left,) = [r for r in caplog.records if "replaced by another writer" in r.getMessage()]
    assert left.hook_file == str(mine)


def test_a_replacement_on_the_same_inode_is_told_by_its_times(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ext4 gives a file just freed's inode to the next one made, so another
    writer's file can have the (st_dev, st_ino) this run wrote: its times
    differ. (Written in place here, so the inode is the same for certain.)
    Before: it was taken for this run's, and removed."""
    caplog.set_level(logging.INFO, "hooks.sdk")

    async def main() -> Path:
        async with Hook(sock_dir / "h.sock") as server:
            mine = _register(server, tmp_path)
            before = os.stat(mine)
            with open(mine, "r+b") as f:  # the other writer's file, on our inode
                f.write(b" ")
            os.utime(mine, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
            assert os.stat(mine).st_ino == before.st_ino
        return mine

    mine = run(main(), "asyncio")
    assert mine.exists()
    (left,) = [r for r in caplog.records if "replaced by another writer" in r.getMessage()]
    assert left.hook_file == str(mine)


def test_a_hook_file_that_cannot_be_removed_is_a_warning_naming_it(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, "hooks.sdk")

    unlink = os.unlink

    async def main() -> Path:
        async with Hook(sock_dir / "h.sock") as server:
            path = _register(server, tmp_path)

            def refuse(name: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
                if os.fspath(name) == str(path):  # os is one module: the socket's own unlink goes on
                    raise PermissionError(13, "Permission denied", str(name))
                unlink(name, *args, **kwargs)  # type: ignore[arg-type]

            monkeypatch.setattr(runscope.os, "unlink", refuse)
        return path

    path = run(main(), "asyncio")
    monkeypatch.undo()
    assert path.exists()
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in warning.getMessage() and warning.hook_file == str(path)
    assert "Permission denied" in warning.error


def test_without_run_nothing_is_recorded(sock_dir: Path, tmp_path: Path) -> None:
    """asyncio.run: the script's own business, as before."""
    async def main() -> Path:
        async with Hook(sock_dir / "h.sock") as server:
            return _register(server, tmp_path)

    assert asyncio.run(main()).exists()




SCRIPT = textwrap.dedent("""
    import asyncio, signal, sys
    from hooks.sdk import HookServer, run, write_hook_config

    class Hook(HookServer):
        async def pre_create_container(self, request):
            return None

    async def main(socket_path, hook_dir, handled):
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        if handled == "yes":
            signal.signal(signal.SIGTERM, lambda *_: loop.call_soon_threadsafe(stop.set))
        async with Hook(socket_path, drain=0.05) as server:
            path = write_hook_config(hook_dir, "h", server.socket_path, ["PreCreateContainer"], failure_policy="Fail")
            print("ready", flush=True)
            await stop.wait()
            path.unlink()  # leaving drains (no sleep of its own: it would wait twice), then stops
        print("drained", flush=True)

    run(main(*sys.argv[1:4]), sys.argv[4])
""")


async def _sigterm(script: Path, socket_path: Path, hook_dir: Path, event_loop: str, handled: bool
                   ) -> tuple[int | None, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(socket_path), str(hook_dir), "yes" if handled else "no", event_loop,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
        assert (hook_dir / "h.json").exists()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
async def test_a_scripts_own_sigterm_handler_drains_and_exits_0(
    sock_dir: Path, tmp_path: Path, event_loop: str
) -> None:
    """run installs no SIGTERM handler: a script's own (signal.signal) gets
    SIGTERM, removes its file, drains and stops, exit 0, as before run
    removed files. Before (a handler of run's on the loop): the loop's wakeup
    fd still gave it SIGTERM, which cancelled the drain: 143."""
    script = tmp_path / "hook.py"
    script.write_text(SCRIPT)
    rc, stdout, stderr = await _sigterm(script, sock_dir / "h.sock", tmp_path / "hooks", event_loop, True)
    assert rc == 0, stderr.decode()
    assert stdout == b"drained\n"
    assert stderr.count(b"hook server draining") == 1, stderr.decode()  # the stop's drain, not cut short
    assert not (tmp_path / "hooks" / "h.json").exists()


async def test_without_a_handler_sigterm_ends_the_script_at_once_and_its_file_stays(
    sock_dir: Path, tmp_path: Path
) -> None:
    """Python's default, which run leaves alone: the README says so."""
    script = tmp_path / "hook.py"
    script.write_text(SCRIPT)
    rc, stdout, _ = await _sigterm(script, sock_dir / "h.sock", tmp_path / "hooks", "asyncio", False)
    assert rc == -signal.SIGTERM and stdout == b""
    assert (tmp_path / "hooks" / "h.json").exists()
