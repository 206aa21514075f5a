"""hooks.sdk.run logs at info, in the proxy's text format, for a script that
set up no logging (else the SDK's start-up and registration lines, and the
author's own, were silent); a script's own logging is left alone."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from hooks.sdk import HookServer, run, write_hook_config

log = logging.getLogger("example_hook")


@contextlib.contextmanager
def no_logging() -> Iterator[logging.Logger]:
    """The root logger as a script that configured nothing finds it (pytest's
    handlers, added for the test's call, put back after)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers[:] = []
    root.setLevel(logging.WARNING)
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


class Hook(HookServer):
    async def pre_create_container(self, request: object) -> None:
        return None


async def serve_and_register(sock: Path, hook_dir: Path) -> list[logging.Handler]:
    async with Hook(sock) as server:
        write_hook_config(hook_dir, "example", server.socket_path, ["PreCreateContainer"])
        log.info("example hook ready", extra={"pods": 0})
        log.debug("example hook detail")
    return logging.getLogger().handlers[:]


def test_without_logging_set_up_it_logs_at_info_in_the_proxys_format(
    sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with no_logging() as root:
        resort = logging.lastResort
        during = run(serve_and_register(sock_dir / "h.sock", tmp_path), "asyncio")
        lines = capsys.readouterr().err.splitlines()
        events = [line.split(" ", 3)[1:] for line in lines]
        assert [level for level, _, _ in events] == ["info"] * 5
        assert [(logger, rest.split("'")[1]) for _, logger, rest in events] == [
            ("hooks.sdk", f"hook server listening on {sock_dir / 'h.sock'}"),
            ("hooks.registration", "hook file written"),
            ("example_hook", "example hook ready"),
            # It never removed its hook file: its server's stop does, under run.
            ("hooks.sdk", f"hook file {tmp_path / 'example.json'} removed: its server is stopping"),
            ("hooks.sdk", "hook server draining: answering new calls for 0.5s while the proxy notices its hook "
                          "file is gone"),
        ]
        assert f"hook_file={tmp_path / 'example.json'} socket={sock_dir / 'h.sock'} hooks=PreCreateContainer " \
               "failure_policy=Ignore" in lines[1]
        assert lines[2].endswith("'example hook ready' pods=0")
        assert during == []  # no handler added: Python's last resort is ours meanwhile
        # Undone after: the process's logging is as it was.
        assert root.handlers == [] and root.level == logging.WARNING and logging.lastResort is resort


def test_a_scripts_own_logging_is_left_alone(
    sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with no_logging() as root:
        theirs = logging.StreamHandler()
        theirs.setFormatter(logging.Formatter("THEIRS %(levelname)s %(message)s"))
        root.addHandler(theirs)
        assert run(serve_and_register(sock_dir / "h.sock", tmp_path), "asyncio") == [theirs]
        assert capsys.readouterr().err == ""  # at their level, WARNING: no info line
        assert root.level == logging.WARNING


def test_a_root_level_set_without_a_handler_stays(
    sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with no_logging() as root:
        root.setLevel(logging.ERROR)
        run(serve_and_register(sock_dir / "h.sock", tmp_path), "asyncio")
        assert capsys.readouterr().err == ""
        assert root.level == logging.ERROR and root.handlers == []


def test_hook_runs_registration_writes_its_hook_file_at_debug(
    sock_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One info line for one registration: hook run logs its own "hook registered"."""
    from hooks.cli import Registration
    from hooks.noop import NoopHook

    caplog.set_level(logging.DEBUG, logger="hooks.registration")
    Registration(tmp_path, "noop", "Ignore", None, None).write(NoopHook(sock_dir / "h.sock"))
    write_hook_config(tmp_path, "script", sock_dir / "h.sock", ["PreCreateContainer"])  # a script's: at info
    written = [(r.levelno, r.hook_file) for r in caplog.records if r.getMessage() == "hook file written"]  # type: ignore[attr-defined]
    assert written == [(logging.DEBUG, str(tmp_path / "noop.json")), (logging.INFO, str(tmp_path / "script.json"))]


async def configure_then_serve(sock: Path, hook_dir: Path) -> list[logging.Handler]:
    logging.basicConfig(level=logging.DEBUG, format="MINE %(levelname)s %(name)s %(message)s")
    return await serve_and_register(sock, hook_dir)


def test_logging_a_script_sets_up_in_its_main_coroutine_takes_every_line(
    sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with no_logging() as root:
        during = run(configure_then_serve(sock_dir / "h.sock", tmp_path), "asyncio")
        lines = capsys.readouterr().err.splitlines()
        assert len(during) == 1 and root.level == logging.DEBUG  # theirs, kept after run
    # In its format, at its level, once each; none of ours.
    assert [line for line in lines if not line.startswith("MINE DEBUG")] == [
        f"MINE INFO hooks.sdk hook server listening on {sock_dir / 'h.sock'}",
        "MINE INFO hooks.registration hook file written",
        "MINE INFO example_hook example hook ready",
        f"MINE INFO hooks.sdk hook file {tmp_path / 'example.json'} removed: its server is stopping",
        "MINE INFO hooks.sdk hook server draining: answering new calls for 0.5s while the proxy notices its hook "
        "file is gone",
    ]
    assert "MINE DEBUG example_hook example hook detail" in lines


def test_a_scripts_handler_on_a_named_logger_takes_its_lines_once(
    sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with no_logging():
        theirs = logging.StreamHandler()
        theirs.setFormatter(logging.Formatter("NAMED %(message)s"))
        log.addHandler(theirs)
        try:
            run(serve_and_register(sock_dir / "h.sock", tmp_path), "asyncio")
        finally:
            log.removeHandler(theirs)
        lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if "example hook ready" in line] == ["NAMED example hook ready"]
    # The SDK's own lines, which no handler of theirs takes: ours, once.
    assert [line.split(" ", 3)[1:3] for line in lines if not line.startswith("NAMED")] == [
        ["info", "hooks.sdk"], ["info", "hooks.registration"], ["info", "hooks.sdk"], ["info", "hooks.sdk"]]
