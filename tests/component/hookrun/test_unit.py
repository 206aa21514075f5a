"""systemd/runtime-proxy-hook@.service: valid for systemd, and its ExecStart
passes --config exactly when the hook's config file exists."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ...prerequisites import fail_or_skip
from .conftest import REPO

UNIT = REPO / "systemd" / "runtime-proxy-hook@.service"


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        fail_or_skip("systemd-analyze is not installed on this machine (scripts/setup.sh installs it)")
    # The template itself, and an instance (where %i is expanded and ExecStart's binary is checked).
    instance = tmp_path / "runtime-proxy-hook@noop.service"
    shutil.copy(UNIT, instance)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(UNIT), str(instance)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 on unknown keys and bad values; it only warns.
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    # systemd joins a line ending in a backslash with the next one.
    parser.read_string(UNIT.read_text().replace("\\\n", " "))
    return parser


def exec_start(instance: str, config_dir: Path, runner: Path) -> list[str]:
    """ExecStart as systemd runs it for ``instance`` (%i expanded, $$ unescaped),
    with the config directory and the runner moved to test paths."""
    line = unit()["Service"]["ExecStart"].replace("%i", instance).replace("$$", "$")
    line = line.replace("/etc/runtime-proxy/hooks/", f"{config_dir}/").replace("/usr/local/bin/runtime-proxy", str(runner))
    return shlex.split(line)


def test_unit_settings() -> None:
    parsed = unit()
    assert parsed["Unit"]["Before"] == "runtime-proxy.service"
    assert parsed["Unit"]["StartLimitIntervalSec"] == "0"  # exit 1 restarted as long as it lasts
    service = parsed["Service"]
    assert (service["Type"], service["Restart"], service["RestartPreventExitStatus"]) == ("notify", "on-failure", "2")


@pytest.mark.parametrize("config_exists", [False, True])
def test_exec_start_passes_config_only_when_it_exists(tmp_path: Path, config_exists: bool) -> None:
    runner = tmp_path / "runtime-proxy"
    runner.write_text('#!/bin/sh\nfor arg in "$@"; do echo "$arg"; done\n')
    runner.chmod(0o755)
    if config_exists:
        (tmp_path / "noop.yaml").write_text("{}\n")
    argv = exec_start("noop", tmp_path, runner)
    env = {"PATH": "/usr/bin:/bin", "HOOK_ARGS": "--failure-policy Fail --timeout 1s"}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=True)
    expected = [
        "hook", "run", "noop",
        "--socket", "/run/runtime-proxy/hooks/noop.sock", "--hook-dir", "/etc/runtime/hookserver.d",
        "--log-format", "json", "--failure-policy", "Fail", "--timeout", "1s",
    ]
    if config_exists:
        expected += ["--config", str(tmp_path / "noop.yaml")]
    assert result.stdout.splitlines() == expected
