"""hooks.sdk.run removes, as it ends by any path, the hook files written
during it for a server started during it (hooks/runscope.py).

Before: a script whose main ended without removing its hook file (an
exception, a cancel, SIGTERM's immediate death, or simply no unlink) left
it naming a socket nobody answered, so a Fail hook refused every call of
its hook points; nothing said so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from hooks import runscope
from hooks.sdk import HookServer, run, write_hook_config


class Hook(HookServer):
    async def pre_create_container(self, request):  # type: ignore[no-untyped-def]
        return None


def _register(server: HookServer, hook_dir: Path, name: str = "h") -> Path:
    return write_hook_config(hook_dir, name, server.socket_path, ["PreCreateContainer"], failure_policy="Fail")


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


def test_a_hook_file_is_removed_when_main_raises(sock_dir: Path, tmp_path: Path) -> None:
    written: list[Path] = []

    async def main() -> None:
        async with Hook(sock_dir / "h.sock") as server:
            written.append(_register(server, tmp_path))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run(main(), "asyncio")
    assert written and not written[0].exists()


def test_a_hook_file_is_removed_when_main_is_cancelled(sock_dir: Path, tmp_path: Path) -> None:
    written: list[Path] = []

    async def main() -> None:
        async with Hook(sock_dir / "h.sock") as server:
            written.append(await asyncio.to_thread(_register, server, tmp_path))  # from a thread too
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.Event().wait()

    with pytest.raises(asyncio.CancelledError):
        run(main(), "asyncio")
    assert written and not written[0].exists()


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


def test_a_hook_file_that_cannot_be_removed_is_a_warning_naming_it(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, "hooks.sdk")

    def refuse(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    async def main() -> Path:
        async with Hook(sock_dir / "h.sock") as server:
            path = _register(server, tmp_path)
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
    import asyncio, sys
    from hooks.sdk import HookServer, run, write_hook_config

    class Hook(HookServer):
        async def pre_create_container(self, request):
            return None

    async def main(socket_path, hook_dir, stubborn):
        async with Hook(socket_path) as server:
            write_hook_config(hook_dir, "h", server.socket_path, ["PreCreateContainer"], failure_policy="Fail")
            print("ready", flush=True)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if stubborn == "yes":  # a main that will not end: only the second SIGTERM ends it
                    print("cancelled", flush=True)
                    await asyncio.Event().wait()
                raise

    run(main(*sys.argv[1:]), "asyncio")
""")


@pytest.mark.parametrize("stubborn", [False, True])
async def test_sigterm_stops_main_removes_the_hook_file_and_then_kills(
    sock_dir: Path, tmp_path: Path, stubborn: bool
) -> None:
    script = tmp_path / "hook.py"
    script.write_text(SCRIPT)
    socket_path = sock_dir / "h.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(socket_path), str(tmp_path / "hooks"), "yes" if stubborn else "no",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
        assert (tmp_path / "hooks" / "h.json").exists()
        proc.send_signal(signal.SIGTERM)
        if stubborn:
            assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"cancelled\n"
            proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == -signal.SIGTERM, stderr.decode()
    # The stubborn main never ended, so the run did not either: its file stays (as before, when the first killed it).
    assert (tmp_path / "hooks" / "h.json").exists() == stubborn
    assert socket_path.exists() == stubborn  # the server stopped as main's async with ended
