"""serve's sockets and directories as the command line and the config file
name them: a relative path is taken from the current directory (grpc reads
``unix:NAME`` as ``/NAME``), and ``--local-containerd`` is the one backend,
for runtime and images alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from runtimeproxy import admin, app, cli
from runtimeproxy.clipath import NonEmptyPath
from runtimeproxy.config import ConfigError, ProxyConfig, load
from runtimeproxy.host import containerd

Started = list[tuple[ProxyConfig, Path | None]]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Started:
    """Replace what serve would start; records the settings it would run with."""
    runs: Started = []

    async def fake_serve(config: ProxyConfig, local_dir: Path | None) -> None:
        runs.append((config, local_dir))

    monkeypatch.setattr(cli, "_serve", fake_serve)
    monkeypatch.setattr(cli.logs, "setup", lambda fmt, level: None)  # keep pytest's log capture
    return runs


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory, with ``~`` below it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


# --------------------------------------------------------------------------- relative paths


def test_relative_paths_in_the_config_file_are_taken_from_the_current_directory(cwd: Path) -> None:
    (cwd / "c.yaml").write_text("listen: proxy.sock\nbackend: run/containerd.sock\nimage-backend: ~/i.sock\nhook-dir: ./hooks\n")
    config = load(Path("c.yaml"))
    assert config.listen == cwd / "proxy.sock"
    assert config.backend == cwd / "run" / "containerd.sock"
    assert config.image_backend == cwd / "home" / "i.sock"
    assert config.hook_dir == cwd / "hooks"


def test_relative_paths_given_in_code_are_made_absolute_too(cwd: Path) -> None:
    config = ProxyConfig().with_overrides(listen="p.sock", backend=Path("b.sock"), hook_dir="~/hooks")
    assert (config.listen, config.backend, config.hook_dir) == (cwd / "p.sock", cwd / "b.sock", cwd / "home" / "hooks")


def test_a_home_directory_that_cannot_be_found_is_a_config_error(cwd: Path) -> None:
    with pytest.raises(ConfigError, match=r"listen '~nosuchuser-rp/p.sock': cannot expand ~"):
        ProxyConfig().with_overrides(listen="~nosuchuser-rp/p.sock")


def test_relative_flags_are_taken_from_the_current_directory(cwd: Path, started: Started) -> None:
    (cwd / "c.yaml").write_text("log-level: debug\n")
    result = CliRunner().invoke(cli.main, [
        "serve", "--config", "c.yaml", "--listen", "p.sock", "--backend", "../b.sock",
        "--image-backend", "~/i.sock", "--hook-dir", "hooks",
    ])
    assert result.exit_code == 0, result.output
    [(config, _)] = started
    assert config.log_level == "debug"  # the file was found
    assert config.listen == cwd / "p.sock"
    assert config.backend == cwd / ".." / "b.sock"  # ".." left for the kernel: cwd may be a symlink
    assert config.image_backend == cwd / "home" / "i.sock"
    assert config.hook_dir == cwd / "hooks"


def test_a_relative_local_containerd_directory_is_absolute(cwd: Path, started: Started) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--local-containerd", "local"])
    assert result.exit_code == 0, result.output
    assert started[0][1] == cwd / "local"


def test_status_asks_the_socket_in_the_current_directory(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Path] = []

    async def fake_fetch(listen: Path, timeout: float) -> dict[str, Any]:
        asked.append(listen)
        return {}

    monkeypatch.setattr(admin, "fetch_status", fake_fetch)
    result = CliRunner().invoke(cli.main, ["status", "--listen", "rel.sock", "--json"])
    assert result.exit_code == 0, result.output
    assert asked == [cwd / "rel.sock"]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The sockets `status` asks (none answers: each is an empty status)."""
    sockets: list[Path] = []

    async def fake_fetch(listen: Path, timeout: float) -> dict[str, Any]:
        sockets.append(listen)
        return {}

    monkeypatch.setattr(admin, "fetch_status", fake_fetch)
    return sockets


def test_status_asks_the_socket_serve_was_configured_with(tmp_path: Path, asked: list[Path]) -> None:
    """status had no --config: a proxy started on a config's `listen` was asked only with --listen repeated."""
    config = tmp_path / "config.yaml"
    config.write_text("listen: unix:///run/elsewhere/proxy.sock\nhook-dir: /etc/hooks\nmetrics-listen: ':9464'\n")
    result = CliRunner().invoke(cli.main, ["status", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    # The flag wins over the file, as for serve; without either, the default.
    flagged = CliRunner().invoke(cli.main, ["status", "--config", str(config), "--listen", "/run/flag.sock", "--json"])
    assert flagged.exit_code == 0, flagged.output
    empty = tmp_path / "empty.yaml"
    empty.write_text("log-level: debug\n")
    assert CliRunner().invoke(cli.main, ["status", "--config", str(empty), "--json"]).exit_code == 0
    assert asked == [Path("/run/elsewhere/proxy.sock"), Path("/run/flag.sock"), ProxyConfig().listen]


def test_status_refuses_a_config_serve_would_refuse(tmp_path: Path, asked: list[Path]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("listen: /run/p.sock\nlisen: /run/typo.sock\n")
    result = CliRunner().invoke(cli.main, ["status", "--config", str(config)])
    assert result.exit_code == 1
    assert result.output == (f"Error: config file {config}: unknown setting 'lisen' (did you mean 'listen'?) (line 2) "
                             "(serve would not start with it); give --listen PATH\n")
    assert asked == []


def test_status_with_listen_given_warns_of_a_broken_config_and_asks(tmp_path: Path, asked: list[Path]) -> None:
    """--listen wins over the file: a broken config refused status all the same, the operator's socket unasked."""
    config = tmp_path / "config.yaml"
    config.write_text("listen: /run/p.sock\nlisen: /run/typo.sock\n")
    result = CliRunner().invoke(cli.main, ["status", "--config", str(config), "--listen", "/run/p.sock", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"warning: config file {config}: unknown setting 'lisen' (did you mean 'listen'?) (line 2) "
                             "(serve would not start with it); asking --listen /run/p.sock\n")
    missing = tmp_path / "missing.yaml"
    result = CliRunner().invoke(cli.main, ["status", "--config", str(missing), "--listen", "/run/p.sock", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == f"warning: cannot read {missing}: No such file or directory; asking --listen /run/p.sock\n"
    assert asked == [Path("/run/p.sock")] * 2


@pytest.mark.parametrize(("make", "reason"), [
    (lambda path: None, "No such file or directory"),
    (lambda path: path.mkdir(), "Is a directory"),
])
def test_status_says_a_config_it_cannot_read_is_unread(
    tmp_path: Path, asked: list[Path], make: Any, reason: str
) -> None:
    """It said "(serve would not start with it; ...)" of a config that was never read: a typo in its path."""
    config = tmp_path / "config.yaml"
    make(config)
    result = CliRunner().invoke(cli.main, ["status", "--config", str(config)])
    assert result.exit_code == 1
    assert result.output == f"Error: cannot read {config}: {reason}; give --listen PATH\n"
    assert asked == []


def test_status_names_a_relative_listen_of_the_config_where_no_socket_is(cwd: Path) -> None:
    """serve under systemd took `listen: proxy.sock` from /, status from the operator's directory;
    the hint told the operator to give the --config they had given."""
    config = cwd / "config.yaml"
    config.write_text("listen: run/proxy.sock\n")
    result = CliRunner().invoke(cli.main, ["status", "--config", str(config), "--timeout", "1"])
    assert result.exit_code == 1
    assert result.output == (f"Error: no socket at {cwd / 'run/proxy.sock'}: the listen of {config}, 'run/proxy.sock', is a "
                             "relative path, taken here from the current directory, and by serve from its own (/ under "
                             "systemd): give --listen with the socket's absolute path\n")
    absolute = cwd / "absolute.yaml"
    absolute.write_text(f"listen: unix://{cwd / 'run/proxy.sock'}\n")
    result = CliRunner().invoke(cli.main, ["status", "--config", str(absolute), "--timeout", "1"])
    assert "relative path" not in result.output and "no proxy is running there" in result.output


def commands(group: click.Group) -> Iterator[click.Command]:
    for command in group.commands.values():
        yield command
        if isinstance(command, click.Group):
            yield from commands(command)


def test_every_path_flag_of_every_command_is_made_absolute(cwd: Path) -> None:
    paths = [p for c in commands(cli.main) for p in c.params if isinstance(p.type, click.Path)]
    assert {p.name for p in paths} >= {"listen", "backend", "image_backend", "hook_dir", "socket_path", "nri_socket"}
    assert all(isinstance(p.type, NonEmptyPath) for p in paths), [p.name for p in paths]
    assert paths[0].type.convert("x.sock", None, None) == cwd / "x.sock"
    assert paths[0].type.convert("~/x.sock", None, None) == cwd / "home" / "x.sock"


# --------------------------------------------------------------------------- --local-containerd


@pytest.mark.parametrize(
    ("flags", "in_file", "named"),
    [
        (["--backend", "/run/other.sock"], "", "--backend"),
        (["--image-backend", "/run/containerd/containerd.sock"], "", "--image-backend"),
        ([], "image-backend: /run/containerd/containerd.sock\n", "image-backend in {file}"),
        ([], "backend: /run/containerd/containerd.sock\n", "backend in {file}"),
        (["--backend", "/run/other.sock"], "image-backend: /run/i.sock\n", "--backend, image-backend in {file}"),
    ],
)
def test_local_containerd_refuses_a_backend_named_besides(
    tmp_path: Path, started: Started, flags: list[str], in_file: str, named: str
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(in_file or "log-level: info\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(file), "--local-containerd", str(tmp_path), *flags])
    assert result.exit_code == 2, result.output
    reason = f"remove {named.format(file=file)}"
    assert result.output.endswith(
        f"Error: --local-containerd serves runtime and images from its own containerd; {reason}\n"
    )
    assert "Traceback" not in result.output
    assert started == []


def test_local_containerd_with_a_null_backend_in_the_file_starts(tmp_path: Path, started: Started) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("backend: null\nimage-backend:\n")
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(file), "--local-containerd", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert started[0][1] == tmp_path


class FakeContainerd:
    """LocalContainerd without a containerd: only its socket is read."""

    def __init__(self, base: Path, die_with_parent: bool = False) -> None:
        self.socket = Path(base) / "containerd.sock"
        self.die_with_parent = die_with_parent
        self.pid: int | None = None
        self.started_pid: int | None = None

    async def __aenter__(self) -> FakeContainerd:
        return self

    async def wait_exit(self) -> int:  # it never exits: _serve ends before
        await asyncio.Event().wait()
        return 0

    async def __aexit__(self, *exc: object) -> None:
        return None


class Built(Exception):
    """Ends _serve once it has built the proxy's settings."""


async def test_the_private_containerd_serves_images_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[ProxyConfig] = []

    async def fake_build(config: ProxyConfig, stack: object, sock: object = None) -> None:
        built.append(config)
        raise Built

    monkeypatch.setattr(containerd, "LocalContainerd", FakeContainerd)
    monkeypatch.setattr(app, "build_proxy", fake_build)
    monkeypatch.setattr(cli.gcpolicy, "before_serving", lambda: None)  # no gc.freeze in the test process
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        monkeypatch.delenv(name, raising=False)
    # As built in code: the command line refuses an image backend beside --local-containerd.
    config = ProxyConfig(listen=tmp_path / "p.sock", image_backend=Path("/run/containerd/containerd.sock"))
    with pytest.raises(Built):
        await cli._serve(config, tmp_path / "local")
    [served] = built
    assert served.backend == tmp_path / "local" / "containerd.sock"
    assert served.image_backend is None  # None: the backend's
