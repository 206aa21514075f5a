"""serve refuses a bad config file naming every problem it refuses, as
check-config lists them (config.check_file): it stopped at the first, and an
operator fixed one, started again, met the next."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from runtimeproxy import cli
from runtimeproxy.checkconfig import check
from runtimeproxy.checkfindings import Severity
from runtimeproxy.config import ProxyConfig

from .test_config_mistakes import started, write  # noqa: F401 (the fixture, for pytest to find)


def test_serve_names_every_error_of_its_config_file(tmp_path: Path, started: list[ProxyConfig]) -> None:  # noqa: F811
    config = write(tmp_path, f"listen: {tmp_path}/p.sock\ngrace-period: -1\nlog-levle: debug\ndata-path: fast\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and started == []
    lines = result.output.rstrip().splitlines()
    assert lines[0] == f"Error: config file {config}: 3 errors:"
    starts = ("  grace-period -1: ", "  unknown setting 'log-levle' (did you mean 'log-level'?)", "  data-path 'fast': ")
    assert [line.startswith(start) for start, line in zip(starts, lines[1:], strict=True)] == [True] * 3
    assert [line.endswith(f"(line {n})") for n, line in zip((2, 3, 4), lines[1:], strict=True)] == [True] * 3
    # the same problems check-config lists, one finding each
    errors = [f.reason for f in check(config, tmp_path).findings if f.severity is Severity.ERROR]
    assert [f"  {reason.removeprefix(f'config file {config}: ')}" for reason in errors] == lines[1:]


def test_serve_names_a_socket_clash_with_the_files_other_errors(tmp_path: Path, started: list[ProxyConfig]) -> None:  # noqa: F811
    config = write(tmp_path, f"listen: {tmp_path}/p.sock\nbackend: {tmp_path}/p.sock\nlog-level: loud\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and started == []
    lines = result.output.rstrip().splitlines()
    assert lines[0] == f"Error: config file {config}: 2 errors:"
    assert lines[1].startswith("  log-level 'loud': expected one of")
    assert lines[2].startswith("  listen and backend are the same socket") and lines[2].endswith("(line 2)")


def test_a_flag_given_for_a_refused_socket_setting_is_checked_for_a_clash(
    tmp_path: Path, started: list[ProxyConfig],  # noqa: F811
) -> None:
    config = write(tmp_path, f"listen: 5\nbackend: {tmp_path}/b.sock\nlog-level: loud\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config), "--listen", f"{tmp_path}/b.sock"])
    assert result.exit_code == 1 and started == []
    assert "3 errors:" in result.output and "listen and backend are the same socket" in result.output


def test_one_error_reads_as_it_did(tmp_path: Path, started: list[ProxyConfig]) -> None:  # noqa: F811
    config = write(tmp_path, "log-level: loud\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and started == []
    assert result.output.startswith(f"Error: config file {config}: log-level 'loud': expected one of ")
    assert result.output.rstrip().endswith("(line 1)") and "errors:" not in result.output
