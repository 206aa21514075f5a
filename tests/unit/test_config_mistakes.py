"""Mistakes an operator makes in a first config: each is refused, by serve and
check-config alike, with a message naming the setting and the fix."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from runtimeproxy import cli
from runtimeproxy.checkconfig import Severity, check
from runtimeproxy.clipath import PATH, SOCKET
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


# kubelet's and crictl's endpoints are URLs, and operators copy them: the
# path they name is read (refusing them under Restart=always left a node
# without a runtime over a spelling).
ACCEPTED_URLS = [
    ("unix:///run/containerd/containerd.sock", "/run/containerd/containerd.sock"),
    ("unix:/run/x.sock", "/run/x.sock"),
    ("UNIX:///run/x.sock", "/run/x.sock"),
    ("unix:////run/x.sock", "/run/x.sock"),
]


@pytest.mark.parametrize(("written", "path"), ACCEPTED_URLS)
def test_an_endpoint_url_in_the_file_is_read_as_its_path(tmp_path: Path, written: str, path: str) -> None:
    config = write(tmp_path, f"listen: /run/p.sock\nbackend: {written}\nimage-backend: {written}\n")
    assert (load(config).backend, load(config).image_backend) == (Path(path), Path(path))


@pytest.mark.parametrize(("written", "path"), ACCEPTED_URLS)
@pytest.mark.parametrize("flag", ["--backend", "--listen", "--image-backend"])
def test_an_endpoint_url_as_a_flag_is_read_as_its_path(
    started: list[ProxyConfig], flag: str, written: str, path: str
) -> None:
    other = "/run/other.sock"  # listen and backend stay apart
    args = ["--backend", other] if flag == "--listen" else ["--listen", other]
    result = CliRunner().invoke(cli.main, ["serve", flag, written, *args])
    assert result.exit_code == 0, result.output
    (config,) = started
    assert getattr(config, flag.removeprefix("--").replace("-", "_")) == Path(path)


def test_check_config_reads_an_endpoint_url_as_serve_does(tmp_path: Path) -> None:
    config = write(tmp_path, "listen: unix:///run/runtime-proxy/p.sock\n")
    report = check(config, tmp_path)
    assert report.ok and report.config is not None
    assert report.config.listen == Path("/run/runtime-proxy/p.sock")


# What names no absolute socket path is refused, with no path to write
# guessed: grpc reads unix:NAME as relative, a host has no place in a unix
# URL, and the proxy speaks to unix sockets only.
REFUSED_URLS = {
    "unix:run/x.sock": "unix:NAME is a path relative to the current directory (as grpc reads it): write the socket's absolute path",
    "unix://host/run/x.sock": "unix://HOST/... (a host in the URL) names no socket path: write unix:///PATH or the path",
    "tcp://127.0.0.1:2376": "expected a unix socket path, not a tcp: endpoint",
    # grpc's and kubelet's schemes with no //: read as a path, under systemd /unix-abstract:ctr, probed for ever
    **{url: f"expected a unix socket path, not a {url.partition(':')[0]}: endpoint" for url in (
        "unix-abstract:ctr", "UNIX-ABSTRACT:ctr", "dns:localhost:1", "vsock:3:1024", "ipv4:127.0.0.1:1",
        "ipv6:[::1]:1", "npipe:////./pipe/ctr")},
    "unix:///": "names no socket path (/ alone is the root directory): write unix:///PATH or the path",
    "unix:/": "names no socket path (/ alone is the root directory): write unix:///PATH or the path",
    "UNIX:": "names no socket path (/ alone is the root directory): write UNIX:///PATH or the path",
    "unix://": "names no socket path (/ alone is the root directory): write unix:///PATH or the path",
    **dict.fromkeys(
        ["unix:///run/a%20b.sock", "unix:///run/x.sock?x=1", "unix:/run/x.sock#f"],
        "a unix: URL with %, ? or # names another socket to kubelet and grpc (they decode %XX and cut "
        "?query and #fragment): write the socket's path",
    ),
}


@pytest.mark.parametrize("written", sorted(REFUSED_URLS))
def test_an_url_naming_no_socket_path_is_refused_in_the_file(tmp_path: Path, written: str) -> None:
    config = write(tmp_path, f"listen: /run/p.sock\nbackend: '{written}'\n")
    with pytest.raises(ConfigError) as err:
        load(config)
    assert str(err.value) == f"config file {config}: backend '{written}': {REFUSED_URLS[written]} (line 2)"
    (finding,) = check(config, tmp_path).findings
    assert (finding.severity, finding.line) == (Severity.ERROR, 2)


@pytest.mark.parametrize("written", sorted(REFUSED_URLS))
def test_an_url_naming_no_socket_path_is_refused_as_a_flag(started: list[ProxyConfig], written: str) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--backend", written])
    assert result.exit_code == 2
    assert f"'{written}': {REFUSED_URLS[written]}" in " ".join(result.output.split())
    assert started == []


# Only unix:, grpc's other schemes and SCHEME:// are URLs: a socket named
# proxy:v2.sock or dnsx:ctr is a path; a file or directory is never a URL
# (c:fg.yaml, unix:///etc/x.yaml as written).
def test_a_socket_that_is_no_url_is_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = write(tmp_path, "listen: proxy:v2.sock\nbackend: dnsx:ctr\nhook-dir: unix:///h\n")
    loaded = load(config)
    assert (loaded.listen, loaded.backend, loaded.hook_dir) == (
        tmp_path / "proxy:v2.sock", tmp_path / "dnsx:ctr", tmp_path / "unix:/h"
    )


def test_a_config_file_is_a_path_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c:fg.yaml").write_text("listen: /run/p.sock\n")
    result = CliRunner().invoke(cli.main, ["check-config", "--config", "c:fg.yaml", "--hook-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli.main, ["check-config", "--config", "unix:///etc/x.yaml"])
    assert result.exit_code == 1 and f"{tmp_path}/unix:/etc/x.yaml" in result.output, result.output


def test_a_directory_flag_is_a_path_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[ProxyConfig]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.main, ["serve", "--hook-dir", "unix:///h"])
    assert result.exit_code == 0, result.output
    assert started[0].hook_dir == tmp_path / "unix:/h"


# Each command line's sockets, and only those, take an endpoint URL.
SOCKET_FLAGS = {
    ("serve",): {  # and koord-runtime-proxy's aliases of them (koordflags.py)
        "listen", "backend", "image_backend",
        "koord_runtimeproxy_endpoint", "remote_runtime_service_endpoint", "remote_image_service_endpoint",
    },
    ("status",): {"listen"},
    ("hook", "run"): {"socket_path"},
    ("hook", "balloons", "status"): {"socket_path"},
    ("nri",): {"nri_socket"},
    ("check-config",): set(),
}


def commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Any:
    """Every command under ``group``, groups too, with its words."""
    for name, command in group.commands.items():
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))


def test_only_socket_flags_read_an_endpoint_url() -> None:
    sockets: dict[tuple[str, ...], set[str]] = {}
    for words, command in commands(cli.main):
        paths = {p.name: p.type for p in command.params if isinstance(p.type, click.Path)}
        assert all(kind is PATH or kind is SOCKET for kind in paths.values()), (words, paths)
        sockets[words] = {name for name, kind in paths.items() if kind is SOCKET}
        assert sockets[words] == SOCKET_FLAGS.get(words, set()), words
    assert set(SOCKET_FLAGS) <= set(sockets)


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
    # the file and the line, as for any setting the file gives
    assert f"Error: config file {config}: listen and {setting} are the same socket" in result.output
    assert result.output.rstrip().endswith("(line 2)")
    assert started == []
    report = check(config, tmp_path)
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert [(f.subject, f.line) for f in errors] == [(config, 2)]
    assert f"listen and {setting} are the same socket" in errors[0].reason


def test_listen_on_the_backends_socket_by_flag_is_refused(tmp_path: Path, started: list[ProxyConfig]) -> None:
    sock = str(tmp_path / "p.sock")
    config = write(tmp_path, f"listen: {sock}\nbackend: {tmp_path / 'other.sock'}\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config), "--backend", sock])
    assert result.exit_code == 1
    # The flag's, not the file's; saying which value came from where.
    assert " ".join(result.output.split()) == (
        f"Error: --backend {sock} on the command line is the socket that config file {config} gives as listen "
        "(line 1): the proxy would forward every call to itself; backend is the runtime's socket (containerd's: "
        f"{ProxyConfig.backend})")
    assert started == []


def test_a_files_backend_under_a_listen_flag_is_named_the_flags_with_the_files_line(
    tmp_path: Path, started: list[ProxyConfig]
) -> None:
    """Before: `config file F: listen and backend are the same socket ...
    (line 2)`, blaming the file for what the command line did."""
    sock = str(tmp_path / "c.sock")
    config = write(tmp_path, f"hook-dir: {tmp_path}\nbackend: {sock}\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config), "--listen", sock])
    assert result.exit_code == 1 and started == []
    assert " ".join(result.output.split()) == (
        f"Error: --listen {sock} on the command line is the socket that config file {config} gives as backend "
        "(line 2): the proxy would forward every call to itself; backend is the runtime's socket (containerd's: "
        f"{ProxyConfig.backend})")


# backend left at its default: listen is the setting written, and the mistake.
def test_listen_on_the_default_backends_socket_blames_listen(tmp_path: Path, started: list[ProxyConfig]) -> None:
    config = write(tmp_path, f"hook-dir: {tmp_path}\nlisten: {ProxyConfig.backend}\n")
    blame = (
        f"listen {ProxyConfig.backend} is the runtime's own socket (backend, by default): the proxy would forward "
        "every call to itself; give the proxy another path and point kubelet at it"
    )
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1
    assert f"Error: config file {config}: {blame} (line 2)" in " ".join(result.output.split())
    assert started == []
    report = check(config)
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert [(f.subject, f.line, f.reason) for f in errors] == [(config, 2, f"config file {config}: {blame} (line 2)")]
    result = CliRunner().invoke(cli.main, ["serve", "--listen", str(ProxyConfig.backend)])
    assert result.exit_code == 1 and f"Error: {blame}" in " ".join(result.output.split())


def test_an_image_backend_equal_to_the_backend_is_accepted(tmp_path: Path, started: list[ProxyConfig]) -> None:
    config = write(tmp_path, f"listen: {tmp_path}/p.sock\nbackend: {tmp_path}/c.sock\nimage-backend: {tmp_path}/c.sock\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert [c.image_backend for c in started] == [tmp_path / "c.sock"]


def test_local_containerd_with_a_listen_path_is_accepted(tmp_path: Path, started: list[ProxyConfig]) -> None:
    # its backend is made at start, under the directory: the default backend's path is free to listen on
    result = CliRunner().invoke(
        cli.main, ["serve", "--local-containerd", str(tmp_path / "c"), "--listen", str(ProxyConfig.backend)]
    )
    assert result.exit_code == 0, result.output
    assert [c.listen for c in started] == [ProxyConfig.backend]


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
    assert [(f.severity, f.line) for f in report.findings if f.subject == config] == [(Severity.ERROR, 2)]


# The same value twice used to load: refusing it now would leave a unit that
# loaded yesterday restarting for ever (StartLimitIntervalSec=0).
SAME_TWICE = "log-level: info\nlisten: /run/p.sock\nlog_level: info\n"
SAME_TWICE_SAID = "'log-level' (line 1) is set again as 'log_level' (line 3), to the same value; keep one"


def test_a_setting_given_twice_with_the_same_value_loads_with_a_warning(
    tmp_path: Path, started: list[ProxyConfig], caplog: pytest.LogCaptureFixture
) -> None:
    config = write(tmp_path, SAME_TWICE)
    caplog.set_level(logging.WARNING, logger="runtimeproxy")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert [c.listen for c in started] == [Path("/run/p.sock")]
    (record,) = [r for r in caplog.records if r.getMessage() == "config file warning"]
    assert (record.line, record.warning) == (3, f"config file {config}: {SAME_TWICE_SAID}")
    report = check(config, tmp_path)
    assert [(f.severity, f.subject, f.line, f.reason) for f in report.findings if f.subject == config] == [
        (Severity.WARNING, config, 3, f"config file {config}: {SAME_TWICE_SAID}")
    ]
    assert report.ok


def test_merge_keys_are_no_setting_given_twice(tmp_path: Path) -> None:
    config = write(tmp_path, "<<: {grace-period: 5, log-level: info}\n<<: {log-level: debug}\nlog-level: warning\n")
    report = check(config, tmp_path)
    assert [f for f in report.findings if f.subject == config] == []
    assert report.config is not None
    assert (report.config.grace_period, report.config.log_level) == (5, "warning")  # the mapping's own key wins


# YAML 1.1 reads these keys as a boolean, a number: named as written, with their line.
@pytest.mark.parametrize("key", ["on", "yes", "1", "null"])
def test_a_key_yaml_reads_as_no_string_is_named_as_written(tmp_path: Path, key: str) -> None:
    config = write(tmp_path, f"listen: /run/p.sock\n{key}: 1\n")
    with pytest.raises(ConfigError) as err:
        load(config)
    assert str(err.value) == f"config file {config}: unknown setting '{key}' (line 2)"
    assert err.value.line == 2


def test_keys_given_once_each_still_load(tmp_path: Path) -> None:
    config: Any = load(write(tmp_path, "grace-period: 3\nhook_dir: /h\nlisten: /run/p.sock\n"))
    assert (config.grace_period, config.hook_dir) == (3, Path("/h"))


def test_a_setting_given_twice_in_an_inline_merge_is_one_setting(tmp_path: Path) -> None:
    config = write(tmp_path, "<<: {grace-period: 5, grace_period: 6}\n")  # merged into the top level: - is _
    with pytest.raises(ConfigError) as err:
        load(config)
    assert str(err.value) == (
        f"config file {config}: 'grace-period' (line 1) is set again as 'grace_period' (line 1), "
        "to different values (YAML keeps the last); keep one"
    )


# Values are compared as YAML nodes: 5 and 5.0 are an int and a float, 0x5 is 5;
# a mapping's keys too.
@pytest.mark.parametrize(
    ("text", "same"),
    [("grace-period: 5\ngrace-period: 5.0\n", False), ("listen: [1]\nlisten: [1.0]\n", False),
     ("listen: {1: a}\nlisten: {1.0: a}\n", False),
     ("grace-period: 0x5\ngrace_period: 5\n", True), ("hook-dir: !!str /h\nhook-dir: /h\n", True)],
)
def test_values_given_twice_are_the_same_as_yaml_reads_them(tmp_path: Path, text: str, same: bool) -> None:
    config = write(tmp_path, text)
    said = "to the same value" if same else "to different values"
    findings = [(f.severity, f.line, said in f.reason) for f in check(config, tmp_path).findings if f.subject == config]
    assert findings == [(Severity.WARNING if same else Severity.ERROR, 2, True)]


RECURSIVE = "grace-period: &a [*a]\ngrace-period: *a\n"


def test_a_recursive_value_given_twice_is_refused_as_a_value_not_a_crash(
    tmp_path: Path, started: list[ProxyConfig]
) -> None:
    config = write(tmp_path, RECURSIVE)
    with pytest.raises(ConfigError) as err:
        load(config)
    assert str(err.value) == f"config file {config}: grace-period [[[...]]]: expected a number of seconds (finite, 0 or more) (line 2)"
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and "expected a number of seconds" in result.output and "Traceback" not in result.output
    # Refused for its value, and (a warning) given twice: both said in one run.
    assert [(f.severity, f.line) for f in check(config, tmp_path).findings if f.subject == config] == [
        (Severity.ERROR, 2), (Severity.WARNING, 2)]


def billion_laughs(levels: int, key: str) -> str:
    """An anchor of nine aliases of the anchor before, ``levels`` deep (9**levels
    strings built out), under an unknown key; then ``key`` twice, as the last."""
    items = ['&a0 ["x","x","x","x","x","x","x","x","x"]']
    items += [f"&a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"anchors: [{', '.join(items)}]\n{key}: *a{levels - 1}\n{key}: *a{levels - 1}\n"


def test_a_billion_laughs_given_twice_is_compared_without_being_built(tmp_path: Path) -> None:
    config = write(tmp_path, billion_laughs(12, "backend"))  # 565 bytes
    script = (
        "import sys; from pathlib import Path; from runtimeproxy.config import load, ConfigError\n"
        "try: load(Path(sys.argv[1]))\nexcept ConfigError as e: print(e)\n"
    )
    # A hang guard, not a speed target: built out, the comparison took 9 s at 10 levels, 12 minutes at 12.
    done = subprocess.run([sys.executable, "-c", script, str(config)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()  # every error named, the value cut short (shown())
    assert lines[:2] == [f"config file {config}: 2 errors:", "  unknown setting 'anchors' (line 1)"], done.stderr
    assert lines[2].startswith("  backend [[[...], [...]") and lines[2].endswith("...]: expected a path (line 3)")
    assert len(lines) == 3 and len(done.stdout) < 1000


def inline_laughs(levels: int) -> str:
    """A flow list of anchors, each of nine aliases of the one before,
    ``levels`` deep: a few hundred bytes, 9**levels strings printed out."""
    items = ['&a0 ["x","x","x","x","x","x","x","x","x"]']
    items += [f"&a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(items)}]"


# Cut short by shown(): two levels, four items a level.
LAUGHS_SHOWN = "[['x', 'x', 'x', 'x', ...], [[...], [...], [...], [...], ...], [[...], [...], [...], [...], ...], " \
    "[[...], [...], [...], [...], ...], ...]"


def test_a_billion_laughs_in_a_settings_value_is_shown_cut_short(tmp_path: Path) -> None:
    keys = ["listen", "serve-versions", "grace-period", "metrics-listen", "log-format", "max-recv-message-bytes"]
    for key in keys:
        (tmp_path / key).mkdir()
        write(tmp_path / key, f"{key}: {inline_laughs(7)}\n")
    script = (
        "import sys; from pathlib import Path; from runtimeproxy.config import load, ConfigError\n"
        "for name in sys.argv[1:]:\n"
        "    try: load(Path(name))\n"
        "    except ConfigError as e: print(e)\n"
    )
    configs = [str(tmp_path / key / "config.yaml") for key in keys]
    # A hang guard: printed out, each message was 28 MB at 7 levels (8: 254 MB, 7 s; 10: out of memory).
    done = subprocess.run([sys.executable, "-c", script, *configs], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == len(keys), done.stderr[-2000:]
    for line, config, key in zip(lines, configs, keys, strict=True):
        assert line.startswith(f"config file {config}: {key} {LAUGHS_SHOWN}: expected "), line[:300]
        assert line.endswith(" (line 1)") and len(line) < 400, line[:300]
