"""Mistakes an operator makes in a first config: each is refused, by serve and
check-config alike, with a message naming the setting and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from runtimeproxy import cli
from runtimeproxy.checkconfig import Severity, check
from runtimeproxy.config import ConfigError, ProxyConfig, load


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[ProxyConfig]:
    """What serve would start with, instead of starting it."""
    runs: list[ProxyConfig] = []

    async def fake_serve(config: ProxyConfig, local_dir: Path | None) -> None:
        runs.append(config)

    monkeypatch.setattr(cli, "_serve", fake_serve)
    monkeypatch.setattr(cli.logs, "setup", lambda fmt, level: None)
    return runs


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# kubelet's and crictl's endpoints are URLs; read as paths they were relative
# ones, under the current directory (/ under systemd: /unix:/run/...).
@pytest.mark.parametrize(
    ("written", "path"),
    [("unix:///run/containerd/containerd.sock", "/run/containerd/containerd.sock"), ("unix:/run/x.sock", "/run/x.sock")],
)
def test_an_endpoint_url_in_the_file_is_refused_naming_the_path_to_write(
    tmp_path: Path, written: str, path: str
) -> None:
    config = write(tmp_path, f"listen: /run/p.sock\nbackend: {written}\n")
    with pytest.raises(ConfigError) as err:
        load(config)
    assert f"backend '{written}': a path, not an endpoint URL: write {path} (line 2)" in str(err.value)


@pytest.mark.parametrize("flag", ["--backend", "--listen", "--image-backend"])
def test_an_endpoint_url_as_a_flag_is_refused_and_starts_nothing(started: list[ProxyConfig], flag: str) -> None:
    result = CliRunner().invoke(cli.main, ["serve", flag, "unix:///run/containerd/containerd.sock"])
    assert result.exit_code != 0
    assert "a path, not an endpoint URL: write /run/containerd/containerd.sock" in result.output
    assert started == []


def test_check_config_refuses_an_endpoint_url_as_serve_does(tmp_path: Path) -> None:
    config = write(tmp_path, "listen: unix:///run/runtime-proxy/p.sock\n")
    report = check(config, tmp_path)
    assert not report.ok
    assert "write /run/runtime-proxy/p.sock" in report.findings[0].reason


# The proxy would forward each call to itself and probe itself for ever.
@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("listen: {d}/p.sock\nbackend: {d}/p.sock\n", "backend"),
        ("listen: {d}/p.sock\nimage-backend: {d}/p.sock\n", "image-backend"),
        ("listen: {d}/link/p.sock\nbackend: {d}/real/p.sock\n", "backend"),  # /var/run and /run
    ],
)
def test_serve_refuses_to_listen_on_its_backends_socket(
    tmp_path: Path, started: list[ProxyConfig], text: str, setting: str
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    config = write(tmp_path, text.format(d=tmp_path))
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1, result.output
    assert f"Error: listen and {setting} are the same socket" in result.output
    assert started == []
    report = check(config, tmp_path)
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert [(f.subject, f.line) for f in errors] == [(config, 2)]
    assert f"listen and {setting} are the same socket" in errors[0].reason


def test_listen_on_the_backends_socket_by_flag_is_refused(tmp_path: Path, started: list[ProxyConfig]) -> None:
    sock = str(tmp_path / "p.sock")
    result = CliRunner().invoke(cli.main, ["serve", "--listen", sock, "--backend", sock])
    assert result.exit_code == 1
    assert "listen and backend are the same socket" in result.output
    assert started == []


def test_an_unknown_key_is_named_as_written_with_the_setting_meant(tmp_path: Path) -> None:
    config = write(tmp_path, "listen: /run/p.sock\ngrace-perod: 5\n")
    with pytest.raises(ConfigError) as err:
        load(config)
    assert str(err.value) == f"config file {config}: unknown setting 'grace-perod' (did you mean 'grace-period'?) (line 2)"


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("max-message-size", "(in YAML: max-recv-message-bytes and max-send-message-bytes, one each)"),
        ("local-containerd", "(in YAML: none: it is the flag --local-containerd only)"),
    ],
)
def test_a_flag_that_is_no_yaml_key_says_what_the_file_takes(tmp_path: Path, key: str, hint: str) -> None:
    config = write(tmp_path, f"{key}: 1\n")
    with pytest.raises(ConfigError) as err:
        load(config)
    assert str(err.value) == f"config file {config}: unknown setting '{key}' {hint} (line 1)"


def test_an_unknown_key_like_no_setting_gets_no_guess(tmp_path: Path) -> None:
    config = write(tmp_path, "zzz: 1\n")
    with pytest.raises(ConfigError) as err:
        load(config)
    assert str(err.value) == f"config file {config}: unknown setting 'zzz' (line 1)"


# YAML keeps the last of two values without a word: an edit near the top of
# the file would silently lose to a line further down.
@pytest.mark.parametrize(
    ("text", "fragment", "line"),
    [
        ("grace-period: 1\nlisten: /run/p.sock\ngrace-period: 30\n", "'grace-period' is set twice (lines 1 and 3)", 3),
        ("hook-dir: /a\nhook_dir: /b\n", "'hook-dir' (line 1) is set again as 'hook_dir' (line 2)", 2),
    ],
)
def test_a_setting_given_twice_is_refused_naming_both_lines(
    tmp_path: Path, started: list[ProxyConfig], text: str, fragment: str, line: int
) -> None:
    config = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(config)
    assert fragment in str(err.value) and err.value.line == line
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and fragment in result.output
    assert started == []


def test_check_config_reports_a_setting_given_twice_at_its_second_line(tmp_path: Path) -> None:
    config = write(tmp_path, "log-level: info\nlog-level: debug\n")
    report = check(config, tmp_path)
    assert [(f.severity, f.line) for f in report.findings] == [(Severity.ERROR, 2)]


def test_keys_given_once_each_still_load(tmp_path: Path) -> None:
    config: Any = load(write(tmp_path, "grace-period: 3\nhook_dir: /h\nlisten: /run/p.sock\n"))
    assert (config.grace_period, config.hook_dir) == (3, Path("/h"))
