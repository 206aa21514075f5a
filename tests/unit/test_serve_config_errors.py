"""serve refuses a bad config file naming every problem it refuses, as
check-config lists them (config.check_file): it stopped at the first, and an
operator fixed one, started again, met the next."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
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
    lines = result.output.rstrip().splitlines()
    # The clash is the flag's, naming the file's backend and its line.
    assert lines[0] == f"Error: 3 errors in config file {config} and the flags:"
    assert lines[1].startswith("  listen 5: ") and lines[2].startswith("  log-level 'loud': ")
    assert lines[3].startswith(f"  flags: --listen {tmp_path}/b.sock on the command line is the socket that config "
                               f"file {config} gives as backend (line 2): ")


def test_a_clash_a_flag_makes_is_named_the_flags_after_the_files_errors(
    tmp_path: Path, started: list[ProxyConfig],  # noqa: F811
) -> None:
    """The heading said "config file X: N errors" of a --listen on the default backend's socket."""
    config = write(tmp_path, "listen: 5\nlog-level: loud\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config), "--listen", str(ProxyConfig.backend)])
    assert result.exit_code == 1 and started == []
    lines = result.output.rstrip().splitlines()
    assert lines[0] == f"Error: 3 errors in config file {config} and the flags:"
    assert lines[1].startswith("  listen 5: ") and lines[2].startswith("  log-level 'loud': ")
    assert lines[3].startswith(f"  flags: listen {ProxyConfig.backend} is the runtime's own socket (backend, by default)")


def test_one_error_reads_as_it_did(tmp_path: Path, started: list[ProxyConfig]) -> None:  # noqa: F811
    config = write(tmp_path, "log-level: loud\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and started == []
    assert result.output.startswith(f"Error: config file {config}: log-level 'loud': expected one of ")
    assert result.output.rstrip().endswith("(line 1)") and "errors:" not in result.output


UVLOOP_MISSING = "uvloop is not installed (pip install uvloop, or use asyncio)"


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError, as where it is missing


@pytest.mark.usefixtures("no_uvloop")
def test_serve_names_a_missing_uvloop_the_file_asks_for_with_its_other_errors(
    tmp_path: Path, started: list[ProxyConfig],  # noqa: F811
) -> None:
    """The event loop was resolved after the file's errors were raised: a
    second start met it."""
    config = write(tmp_path, f"listen: {tmp_path}/p.sock\nlog-level: loud\nevent-loop: uvloop\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and started == []
    lines = result.output.rstrip().splitlines()
    assert lines[0] == f"Error: config file {config}: 2 errors:"
    assert lines[1].startswith("  log-level 'loud': ") and lines[1].endswith("(line 2)")
    assert lines[2] == f"  event-loop 'uvloop': {UVLOOP_MISSING} (line 3)"
    # check-config finds it too, on its line (it said nothing of it)
    (finding,) = [f for f in check(config, tmp_path).findings if "uvloop" in f.reason]
    assert (finding.severity, finding.line, finding.reason) == (Severity.ERROR, 3, f"event-loop 'uvloop': {UVLOOP_MISSING}")


@pytest.mark.usefixtures("no_uvloop")
def test_serve_names_a_missing_uvloop_the_flag_asks_for_after_the_files_errors(
    tmp_path: Path, started: list[ProxyConfig],  # noqa: F811
) -> None:
    config = write(tmp_path, f"listen: {tmp_path}/p.sock\nevent-loop: asyncio\nlog-level: loud\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config), "--event-loop", "uvloop"])
    assert result.exit_code == 1 and started == []
    lines = result.output.rstrip().splitlines()
    assert lines[0] == f"Error: 2 errors in config file {config} and the flags:"
    assert lines[1].startswith("  log-level 'loud': ")
    assert lines[2] == f"  flags: event loop 'uvloop': {UVLOOP_MISSING}"


@pytest.mark.usefixtures("no_uvloop")
def test_flags_errors_alone_are_headed_as_the_flags(tmp_path: Path, started: list[ProxyConfig]) -> None:  # noqa: F811
    result = CliRunner().invoke(
        cli.main, ["serve", "--listen", str(ProxyConfig.backend), "--event-loop", "uvloop"],
    )
    assert result.exit_code == 1 and started == []
    lines = result.output.rstrip().splitlines()
    assert lines[0] == "Error: 2 errors in the flags:"
    assert lines[1].startswith(f"  listen {ProxyConfig.backend} is the runtime's own socket")
    assert lines[2] == f"  event loop 'uvloop': {UVLOOP_MISSING}"


def test_check_config_says_nothing_of_uvloop_when_it_imports_or_is_not_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = write(tmp_path, f"listen: {tmp_path}/p.sock\nevent-loop: uvloop\n")
    assert not [f for f in check(config, tmp_path).findings if "uvloop" in f.reason]  # installed here
    monkeypatch.setitem(sys.modules, "uvloop", None)
    config = write(tmp_path, f"listen: {tmp_path}/p.sock\nevent-loop: auto\n")  # asyncio's then
    assert not [f for f in check(config, tmp_path).findings if "uvloop" in f.reason]


def test_local_containerd_and_a_backend_in_the_file_are_named_with_the_files_other_errors(
    tmp_path: Path, started: list[ProxyConfig],  # noqa: F811
) -> None:
    """The refusal of a backend besides --local-containerd came after the file's errors were raised."""
    config = write(tmp_path, "backend: /run/containerd/containerd.sock\nlog-level: loud\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config), "--local-containerd", str(tmp_path)])
    assert result.exit_code == 2 and started == []  # a misuse of the command line, as alone
    lines = result.output.rstrip().splitlines()
    at = lines.index(f"Error: 2 errors in config file {config} and the flags:")
    assert lines[at + 1].startswith("  log-level 'loud': ") and lines[at + 1].endswith("(line 2)")
    assert lines[at + 2] == (
        f"  flags: --local-containerd serves runtime and images from its own containerd; remove backend in {config}"
    )
    assert len(lines) == at + 3


def test_local_containerd_with_an_unreadable_file_names_both(tmp_path: Path, started: list[ProxyConfig]) -> None:  # noqa: F811
    config = write(tmp_path, "backend: [unclosed\n")
    result = CliRunner().invoke(
        cli.main, ["serve", "--config", str(config), "--local-containerd", str(tmp_path), "--backend", "/run/b.sock"],
    )
    assert result.exit_code == 2 and started == [] and "Traceback" not in result.output
    assert f"Error: 2 errors in config file {config} and the flags:" in result.output
    assert "  cannot read config file " in result.output
    assert result.output.rstrip().endswith("  flags: --local-containerd serves runtime and images from its own "
                                           "containerd; remove --backend")
