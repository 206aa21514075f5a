"""config.load / with_overrides, and the CLI's handling of settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from runtimeproxy import cli
from runtimeproxy.config import (
    MIB,
    SERVE_VERSIONS_FORMS,
    ConfigError,
    ProxyConfig,
    choices,
    load,
    parse_host_port,
)
from runtimeproxy.cripath.versions import parse_serve_versions

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- load


def test_no_file_gives_defaults() -> None:
    config = load(None)
    assert config == ProxyConfig()
    assert config.serve_versions == "auto"
    assert config.backend_version is None
    assert config.max_recv_message_bytes == 16 * MIB


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")) == ProxyConfig()
    assert load(write(tmp_path, "# only a comment\n", "c.yaml")) == ProxyConfig()


def test_keys_with_dashes_or_underscores(tmp_path: Path) -> None:
    config = load(
        write(
            tmp_path,
            "listen: /tmp/p.sock\n"
            "image-backend: /tmp/img.sock\n"
            "hook_dir: /tmp/hooks\n"
            "serve-versions: v1alpha2\n"
            "backend_version: v1\n"
            "max-recv-message-bytes: 1024\n"
            "max_send_message_bytes: 2048\n"
            "grace-period: 2.5\n"
            "log-format: json\n",
        )
    )
    assert config.listen == Path("/tmp/p.sock")
    assert config.image_backend == Path("/tmp/img.sock")
    assert config.hook_dir == Path("/tmp/hooks")
    assert all(isinstance(p, Path) for p in (config.listen, config.image_backend, config.hook_dir))
    assert config.serve_versions == "v1alpha2"
    assert config.backend_version == "v1"
    assert (config.max_recv_message_bytes, config.max_send_message_bytes) == (1024, 2048)
    assert config.grace_period == 2.5
    assert config.log_format == "json"
    # Untouched settings keep their defaults.
    assert config.backend == ProxyConfig().backend
    assert config.log_level == "info"


def test_serve_versions_as_a_list(tmp_path: Path) -> None:
    assert load(write(tmp_path, "serve-versions: [v1, v1alpha2]\n")).serve_versions == "v1,v1alpha2"
    assert load(write(tmp_path, "serve_versions:\n  - v1alpha2\n", "b.yaml")).serve_versions == "v1alpha2"


# Each of these was once loaded, then made serve fail with a traceback.
BAD_VALUES = [
    ("metrics-listen: 9464\n", "metrics-listen 9464: expected HOST:PORT as a string"),
    ('metrics-listen: "localhost"\n', "metrics-listen 'localhost': expected HOST:PORT with a port from 0 to 65535"),
    ('metrics-listen: ":65536"\n', "metrics-listen ':65536': expected HOST:PORT"),
    ('metrics-listen: "::1:9464"\n', "metrics-listen '::1:9464': an IPv6 address goes in brackets"),
    ("metrics-listen: true\n", "metrics-listen True: expected HOST:PORT as a string"),
    ("listen: 5\n", "listen 5: expected a path"),
    ('listen: ""\n', "listen '': expected a path"),
    ("grace-period: .inf\n", "grace-period inf: expected a number of seconds"),
    ("grace-period: .nan\n", "grace-period nan: expected a number of seconds"),
    ("state-resync-interval: .inf\n", "state-resync-interval inf: expected a number of seconds"),
    ("probe-max-interval: 0\n", "probe-max-interval 0: expected a number of seconds (finite, more than 0)"),
    ("serve-versions: [1, 2]\n", "serve-versions '1,2'"),
]


@pytest.mark.parametrize(("text", "reason"), BAD_VALUES)
def test_values_serve_cannot_run_with_are_errors_naming_key_and_line(tmp_path: Path, text: str, reason: str) -> None:
    path = write(tmp_path, "log-level: info\n" + text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert f"config file {path}: {reason}" in str(err.value)
    assert str(err.value).endswith("(line 2)") and err.value.line == 2


@pytest.mark.parametrize(
    ("text", "setting", "value"),
    [
        ('metrics-listen: "0.0.0.0:9464"\n', "metrics_listen", "0.0.0.0:9464"),
        ('metrics-listen: ":9464"\n', "metrics_listen", ":9464"),
        ('metrics-listen: "[::1]:9464"\n', "metrics_listen", "[::1]:9464"),
        # Spellings getaddrinfo reads, kept: a name (one /etc/hosts may hold), 127.1, a link-local scope.
        ('metrics-listen: "node-1.example.:9464"\n', "metrics_listen", "node-1.example.:9464"),
        ('metrics-listen: "my_host:9464"\n', "metrics_listen", "my_host:9464"),
        ('metrics-listen: "127.1:9464"\n', "metrics_listen", "127.1:9464"),
        ('metrics-listen: "[fe80::1%eth0]:9464"\n', "metrics_listen", "[fe80::1%eth0]:9464"),
        ('metrics-listen: "9464"\n', "metrics_listen", "9464"),  # a bare port: 127.0.0.1, as before
        ('metrics-listen: ""\n', "metrics_listen", None),  # off, as for `runtime-proxy nri`
        ("metrics-listen: null\n", "metrics_listen", None),
        ("image-backend: null\n", "image_backend", None),
        ("backend-version: null\n", "backend_version", None),
        ("grace-period: 0\n", "grace_period", 0),
        # null (or a key with nothing after it) is the default, as if the key were left out
        ("backend: null\n", "backend", ProxyConfig().backend),
        ("hook-dir:\n", "hook_dir", ProxyConfig().hook_dir),
        ("listen: ~\n", "listen", ProxyConfig().listen),
        ("grace-period: null\n", "grace_period", ProxyConfig().grace_period),
    ],
)
def test_values_that_mean_something_still_load(tmp_path: Path, text: str, setting: str, value: object) -> None:
    assert getattr(load(write(tmp_path, text)), setting) == value


def test_a_flag_still_wins_over_a_null_in_the_file(tmp_path: Path) -> None:
    config = load(write(tmp_path, "backend: null\nmetrics-listen: \"\"\n")).with_overrides(
        backend="/run/other.sock", metrics_listen=":9464")
    assert (config.backend, config.metrics_listen) == (Path("/run/other.sock"), ":9464")
    assert load(write(tmp_path, 'metrics-listen: ":9464"\n', "b.yaml")).with_overrides(metrics_listen="").metrics_listen is None


@pytest.mark.parametrize(
    ("address", "bound"),
    [(":9464", ("127.0.0.1", 9464)), ("0.0.0.0:1", ("0.0.0.0", 1)), ("[::1]:65535", ("::1", 65535)),
     ("node.example:80", ("node.example", 80))],
)
def test_parse_host_port_is_what_serve_binds(address: str, bound: tuple[str, int]) -> None:
    assert parse_host_port(address) == bound


def test_the_example_config_loads() -> None:
    config = load(REPO / "systemd" / "config.yaml")
    assert config.listen == Path("/var/run/runtime-proxy/runtime-proxy.sock")
    assert config.serve_versions == "auto"
    assert config.log_format == "json"
    assert config.max_recv_message_bytes == 16 * MIB


def test_unknown_key_is_an_error_naming_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "listen: /tmp/p.sock\nbackends: /tmp/typo.sock\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(path) in str(err.value)
    assert "unknown setting 'backends'" in str(err.value)


def test_extra_is_not_a_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown setting 'extra'"):
        load(write(tmp_path, "extra: {}\n"))


@pytest.mark.parametrize("text", ["- listen\n- backend\n", "just a string\n", "42\n"])
def test_non_mapping_is_an_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="expected a mapping at the top level") as err:
        load(path)
    assert str(path) in str(err.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="cannot read config file") as err:
        load(path)
    assert str(path) in str(err.value)


def test_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path)


def test_invalid_yaml_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(write(tmp_path, "listen: [unclosed\n"))


@pytest.mark.parametrize("content", ["a: " + "[" * 3000 + "]" * 3000 + "\n", "listen: \udcff\n"])
def test_yaml_nested_too_deeply_or_not_utf8_is_a_clear_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("serve-versions: v2\n", "serve-versions 'v2'"),
        ("serve-versions: [v1, v3]\n", "serve-versions 'v1,v3'"),
        ("backend-version: v1beta1\n", "backend-version 'v1beta1'"),
        ("unknown-fields: drop\n", "unknown-fields 'drop': expected one of refuse, forward"),
    ],
)
def test_invalid_version_settings_are_errors(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert fragment in str(err.value)
    assert str(path) in str(err.value)


# --------------------------------------------------------------------------- with_overrides


def test_with_overrides_none_means_not_given() -> None:
    base = ProxyConfig(serve_versions="v1", grace_period=3.0)
    config = base.with_overrides(serve_versions=None, grace_period=None, backend=None, log_level=None)
    assert config == base
    assert config.backend == ProxyConfig().backend  # None did not clear it


def test_with_overrides_applies_and_coerces_paths() -> None:
    config = ProxyConfig().with_overrides(
        listen="/tmp/l.sock", backend="/tmp/b.sock", image_backend="/tmp/i.sock", hook_dir="/tmp/h",
        serve_versions="v1,v1alpha2", backend_version="v1alpha2", grace_period=1.5,
    )
    assert config.listen == Path("/tmp/l.sock") and isinstance(config.listen, Path)
    assert config.backend == Path("/tmp/b.sock") and isinstance(config.backend, Path)
    assert config.image_backend == Path("/tmp/i.sock") and isinstance(config.image_backend, Path)
    assert config.hook_dir == Path("/tmp/h") and isinstance(config.hook_dir, Path)
    assert config.serve_versions == "v1,v1alpha2"
    assert config.backend_version == "v1alpha2"
    assert config.grace_period == 1.5


def test_with_overrides_returns_a_new_config() -> None:
    base = ProxyConfig()
    assert base.with_overrides(log_level="debug") is not base
    assert base.log_level == "info"


def test_with_overrides_rejects_unknown_and_invalid() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'nope'"):
        ProxyConfig().with_overrides(nope=1)
    with pytest.raises(ConfigError, match="serve-versions 'v9'"):
        ProxyConfig().with_overrides(serve_versions="v9")


@pytest.mark.parametrize("bad", [0, -1, True, "many", 1.5])
def test_max_concurrent_streams_must_be_a_positive_count(bad: object) -> None:
    with pytest.raises(ConfigError, match="max-concurrent-streams"):
        ProxyConfig().with_overrides(max_concurrent_streams=bad)
    assert ProxyConfig().with_overrides(max_concurrent_streams=64).max_concurrent_streams == 64


@pytest.mark.parametrize("bad", [0.5, 0.001, -1, "300"])
def test_state_resync_interval_is_off_or_at_least_a_second(bad: object) -> None:
    with pytest.raises(ConfigError, match="state-resync-interval"):
        ProxyConfig().with_overrides(state_resync_interval=bad)
    for good in (0, 1, 300.0):
        assert ProxyConfig().with_overrides(state_resync_interval=good).state_resync_interval == good


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[ProxyConfig, Any]]:
    """Replace what serve would start; records the settings it would run with."""
    runs: list[tuple[ProxyConfig, Any]] = []

    async def fake_serve(config: ProxyConfig, local_dir: Path | None) -> None:
        runs.append((config, local_dir))

    monkeypatch.setattr(cli, "_serve", fake_serve)
    monkeypatch.setattr(cli.logs, "setup", lambda fmt, level: None)  # keep pytest's log capture
    return runs


def test_serve_help_lists_the_flags(started: list[Any]) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--help"])
    assert result.exit_code == 0, result.output
    for flag in (
        "--config",
        "--listen",
        "--backend",
        "--image-backend",
        "--local-containerd",
        "--hook-dir",
        "--serve-versions",
        "--backend-version",
        "--unknown-fields",
        "--max-message-size",
        "--grace-period",
        "--metrics-listen",
        "--log-format",
        "--log-level",
    ):
        assert flag in result.output
    assert "auto | v1 | v1alpha2 | v1,v1alpha2" in result.output
    assert started == []


def test_top_level_help_lists_serve() -> None:
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    assert "serve" in result.output


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("listen: /tmp/x.sock\nbogus-key: 1\n", "unknown setting 'bogus-key'"),
        ("- a\n- b\n", "expected a mapping at the top level"),
        ("listen: [unclosed\n", "cannot read config file"),
        ("serve-versions: v3\n", "serve-versions 'v3'"),
    ],
)
def test_invalid_config_file_is_a_clear_error_and_starts_nothing(
    tmp_path: Path, started: list[Any], text: str, fragment: str
) -> None:
    path = write(tmp_path, text)
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(path)])
    assert result.exit_code != 0
    assert "Error:" in result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    assert started == []


@pytest.mark.parametrize(("text", "reason"), BAD_VALUES)
def test_serve_refuses_what_serve_cannot_run_with_in_one_line(
    tmp_path: Path, started: list[Any], text: str, reason: str
) -> None:
    path = write(tmp_path, text)
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(path), "--hook-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: config file {path}: {reason}")
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert started == []


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--metrics-listen", "localhost"], "metrics-listen 'localhost': expected HOST:PORT"),
        (["--metrics-listen", "127.0.0.1:99999"], "metrics-listen '127.0.0.1:99999': expected HOST:PORT"),
        (["--metrics-listen", "no such host:9464"], "metrics-listen 'no such host:9464': 'no such host' is not an IP address"),
        (["--grace-period", "inf"], "grace-period inf: expected a number of seconds"),
        (["--grace-period", "nan"], "grace-period nan: expected a number of seconds"),
    ],
)
def test_serve_refuses_such_flags_too(started: list[Any], flags: list[str], reason: str) -> None:
    result = CliRunner().invoke(cli.main, ["serve", *flags])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {reason}") and "Traceback" not in result.output
    assert started == []


def test_missing_config_file_is_a_clear_error(tmp_path: Path, started: list[Any]) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code != 0
    assert "cannot read config file" in result.output
    assert started == []


def test_invalid_serve_versions_flag_is_a_clear_error(started: list[Any]) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--serve-versions", "v1,v2"])
    assert result.exit_code != 0
    assert "serve-versions 'v1,v2'" in result.output
    assert started == []


def test_invalid_backend_version_flag_is_rejected_by_click(started: list[Any]) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--backend-version", "v2"])
    assert result.exit_code == 2
    assert "--backend-version" in result.output
    assert started == []


def test_flags_win_over_the_config_file(tmp_path: Path, started: list[Any]) -> None:
    path = write(
        tmp_path,
        "listen: /tmp/from-file.sock\nbackend: /tmp/file-backend.sock\nserve-versions: v1\ngrace-period: 7\n",
    )
    result = CliRunner().invoke(
        cli.main,
        [
            "serve", "--config", str(path), "--listen", "/tmp/from-flag.sock",
            "--serve-versions", "v1,v1alpha2", "--backend-version", "v1alpha2", "--max-message-size", "4096",
        ],
    )
    assert result.exit_code == 0, result.output
    [(config, local_dir)] = started
    assert local_dir is None
    assert config.listen == Path("/tmp/from-flag.sock")
    assert config.backend == Path("/tmp/file-backend.sock")  # from the file: no flag given
    assert config.serve_versions == "v1,v1alpha2"
    assert config.backend_version == "v1alpha2"
    assert config.grace_period == 7
    assert (config.max_recv_message_bytes, config.max_send_message_bytes) == (4096, 4096)


# --------------------------------------------------------------------------- CLI defaults are ProxyConfig's

# setting -> the serve flag that sets it; every other setting has no flag
FLAG_OF = {
    "listen": "listen", "backend": "backend", "image_backend": "image_backend", "hook_dir": "hook_dir",
    "serve_versions": "serve_versions", "backend_version": "backend_version", "unknown_fields": "unknown_fields",
    "max_recv_message_bytes": "max_message_size", "max_send_message_bytes": "max_message_size",
    "max_concurrent_streams": "max_concurrent_streams",
    "grace_period": "grace_period", "metrics_listen": "metrics_listen", "data_path": "data_path",
    "event_loop": "event_loop",
    "log_format": "log_format", "log_level": "log_level",
}


def serve_options() -> dict[str, click.Option]:
    # Not koord-runtime-proxy's hidden flags (koordflags.py): aliases, not settings.
    return {p.name: p for p in cli.serve.params if isinstance(p, click.Option) and p.name and not p.hidden}


def test_every_setting_but_the_internal_ones_has_a_flag() -> None:
    # Tuning an operator rarely touches is set in the YAML file only.
    settings = {f.name for f in dataclasses.fields(ProxyConfig)} - {"extra", "probe_max_interval",
                                                                      "state_resync_interval"}
    assert set(FLAG_OF) == settings
    assert set(FLAG_OF.values()) | {"config_file", "local_containerd"} == set(serve_options())


@pytest.mark.parametrize("setting", sorted(FLAG_OF))
def test_cli_default_and_choices_are_proxy_configs(setting: str) -> None:
    option = serve_options()[FLAG_OF[setting]]
    assert option.default == getattr(ProxyConfig(), setting)
    if choices(setting):
        assert isinstance(option.type, click.Choice)
        assert tuple(option.type.choices) == choices(setting)


def test_help_shows_the_defaults() -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    defaults = ProxyConfig()
    for shown in (
        f"[default: {defaults.listen}]",
        f"[default: {defaults.backend}]",
        f"[default: {defaults.hook_dir}]",
        f"[default: {defaults.serve_versions}]",
        f"[default: {defaults.unknown_fields}]",
        f"[default: {defaults.max_recv_message_bytes // MIB} MiB]",
        f"[default: {defaults.grace_period}]",
        "[default: off]",
        f"[default: {defaults.log_format}]",
        f"[default: {defaults.log_level}]",
        "[text|json]",
        "[debug|info|warning|error]",
    ):
        assert shown in result.output


def test_serve_versions_forms_are_valid() -> None:
    for form in SERVE_VERSIONS_FORMS:
        parse_serve_versions(form)


def test_no_flags_runs_with_proxy_config_defaults(started: list[Any]) -> None:
    result = CliRunner().invoke(cli.main, ["serve"])
    assert result.exit_code == 0, result.output
    assert started == [(ProxyConfig(), None)]


def test_flags_left_out_leave_the_config_file_in_charge(tmp_path: Path, started: list[Any]) -> None:
    # Flags have defaults now: only flags actually given may override the file.
    path = write(tmp_path, "log-level: debug\nunknown-fields: forward\ngrace-period: 3\nmax-send-message-bytes: 100\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(path), "--log-format", "json"])
    assert result.exit_code == 0, result.output
    [(config, _)] = started
    assert (config.log_level, config.unknown_fields, config.grace_period) == ("debug", "forward", 3)
    assert (config.max_recv_message_bytes, config.max_send_message_bytes) == (16 * MIB, 100)
    assert config.log_format == "json"


@pytest.mark.parametrize(
    "args",
    [
        ["--backend", ""],
        ["--listen", ""],
        ["--local-containerd", ""],  # `--local-containerd "$DIR"` with DIR unset: not the current directory
        ["--config", ""],
    ],
)
def test_an_empty_path_on_the_command_line_is_refused_and_starts_nothing(started: list[Any], args: list[str]) -> None:
    result = CliRunner().invoke(cli.main, ["serve", *args])
    assert result.exit_code == 2
    assert "an empty path (an unset variable?)" in result.output and args[0] in result.output
    assert started == []


def test_a_count_over_grpcs_int32_on_the_command_line_is_refused(started: list[Any]) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--max-message-size", str(2**31)])
    assert result.exit_code != 0
    assert "at most 2147483647" in result.output
    assert started == []
