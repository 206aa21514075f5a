"""Which event loop a process runs on (`--event-loop`, `event-loop:`)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hooks.cli import hook
from runtimeproxy import cli, eventloop
from runtimeproxy.config import ConfigError, ProxyConfig, choices, load
from runtimeproxy.nri.cli import nri


@pytest.mark.parametrize(
    "choice, installed, loop",
    [
        ("auto", True, "uvloop"),
        ("auto", False, "asyncio"),
        ("uvloop", True, "uvloop"),
        ("asyncio", True, "asyncio"),
        ("asyncio", False, "asyncio"),
    ],
)
def test_resolve(choice: str, installed: bool, loop: str) -> None:
    assert eventloop.resolve(choice, available=installed) == loop


def test_uvloop_asked_for_but_missing_is_an_error() -> None:
    with pytest.raises(eventloop.EventLoopError, match="uvloop is not installed"):
        eventloop.resolve("uvloop", available=False)


def test_an_unknown_loop_is_an_error() -> None:
    with pytest.raises(eventloop.EventLoopError, match="expected one of auto, asyncio, uvloop"):
        eventloop.resolve("trio")


def test_uvloop_is_installed_with_the_package() -> None:
    # A dependency: `auto` means uvloop wherever the package is installed as specified.
    assert eventloop.uvloop_available()
    assert eventloop.resolve("auto") == "uvloop"


def test_a_uvloop_that_does_not_import_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert not eventloop.uvloop_available()
    assert eventloop.resolve("auto") == "asyncio"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_run_runs_on_the_loop_and_returns_the_result(loop: str) -> None:
    async def main() -> tuple[str, int]:
        await asyncio.sleep(0)
        return eventloop.running_loop_name(), 42

    assert eventloop.run(main(), loop) == (loop, 42)


def test_the_setting_defaults_to_auto_and_is_read_from_yaml(tmp_path: Path) -> None:
    assert ProxyConfig().event_loop == "auto"
    assert choices("event_loop") == eventloop.EVENT_LOOPS
    path = tmp_path / "config.yaml"
    path.write_text("event-loop: asyncio\n")
    assert load(path).event_loop == "asyncio"
    path.write_text("listen: /tmp/x.sock\nevent-loop: libev\n")
    with pytest.raises(ConfigError, match=r"event-loop 'libev': expected one of auto, asyncio, uvloop \(line 2\)"):
        load(path)


def test_serve_refuses_uvloop_when_missing_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventloop, "uvloop_available", lambda: False)
    started: list[object] = []
    monkeypatch.setattr(eventloop, "run", lambda main, loop: started.append(main))
    result = CliRunner().invoke(cli.main, ["serve", "--listen", str(tmp_path / "p.sock"), "--event-loop", "uvloop"])
    assert result.exit_code == 1
    assert "event loop 'uvloop': uvloop is not installed" in result.output
    assert started == []


@pytest.mark.parametrize("command", [cli.serve, nri, hook.commands["run"]], ids=["serve", "nri", "hook run"])
def test_every_long_running_command_takes_the_flag_with_default_auto(command: object) -> None:
    options = {p.name: p for p in command.params}  # type: ignore[attr-defined]
    option = options["event_loop"]
    assert tuple(option.type.choices) == eventloop.EVENT_LOOPS
    assert option.default == "auto"
