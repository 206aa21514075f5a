"""``runtime-proxy serve`` given koord-runtime-proxy's flags, as a unit carried
over from it passes them: its endpoint flags taken as deprecated aliases of
ours, its mode and skip-label flags accepted where they ask for what the
proxy does, the rest refused, each named with what replaces it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from runtimeproxy import cli
from runtimeproxy.cli import main
from runtimeproxy.clipath import SOCKET
from runtimeproxy.koordflags import KOORD_FLAGS, image_calls_moved, koord_aliases, koord_flags


def serve(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["serve", *args])


def aliases(*args: str) -> tuple[Any, dict[str, object], list[str]]:
    """serve's three socket flags and koord-runtime-proxy's, through koord_aliases."""
    seen: dict[str, Any] = {}

    @click.command()
    @click.option("--listen", type=SOCKET)
    @click.option("--backend", type=SOCKET)
    @click.option("--image-backend", type=SOCKET)
    @koord_flags
    def command(**flags: object) -> None:
        seen["warnings"] = koord_aliases(click.get_current_context(), flags)
        seen["flags"] = flags

    result = CliRunner().invoke(command, list(args))
    return result, seen.get("flags", {}), seen.get("warnings", [])


def test_the_endpoint_flags_are_aliases_of_ours_with_a_warning_naming_each() -> None:
    result, flags, warnings = aliases(
        "--koord-runtimeproxy-endpoint", "/var/run/koord-runtimeproxy/runtimeproxy.sock",
        "--remote-runtime-service-endpoint=unix:///run/containerd/containerd.sock",
        "--remote-image-service-endpoint=/run/containerd/containerd.sock",
    )
    assert result.exit_code == 0, result.output
    assert flags == {
        "listen": Path("/var/run/koord-runtimeproxy/runtimeproxy.sock"),
        "backend": Path("/run/containerd/containerd.sock"),  # read as --backend reads it
        "image_backend": Path("/run/containerd/containerd.sock"),
    }
    assert warnings == [
        "--koord-runtimeproxy-endpoint is deprecated: use --listen /var/run/koord-runtimeproxy/runtimeproxy.sock",
        "--remote-runtime-service-endpoint is deprecated: use --backend /run/containerd/containerd.sock",
        "--remote-image-service-endpoint is deprecated: use --image-backend /run/containerd/containerd.sock"
        "; leave it out when it is the runtime's socket, or where koord-runtime-proxy (v1.4 and later)"
        " sent image calls to the runtime's socket whatever it said",
    ]


def test_an_alias_and_its_replacement_must_agree() -> None:
    result, flags, _ = aliases("--backend=/run/a.sock", "--remote-runtime-service-endpoint=/run/a.sock")
    assert result.exit_code == 0 and flags["backend"] == Path("/run/a.sock")
    result, _, _ = aliases("--backend=/run/a.sock", "--remote-runtime-service-endpoint=/run/b.sock")
    assert result.exit_code == 2
    assert "--remote-runtime-service-endpoint=/run/b.sock: --backend /run/a.sock is given too; give --backend alone" in result.output


def test_an_alias_naming_the_same_socket_by_another_path_agrees(tmp_path: Path) -> None:
    """As image_calls_moved compares them: resolved (``/var/run/x`` and ``/run/x``
    where /var/run links to /run), not as written."""
    (tmp_path / "run").mkdir()
    (tmp_path / "var-run").symlink_to(tmp_path / "run")
    ours, theirs = tmp_path / "run" / "c.sock", tmp_path / "var-run" / "c.sock"
    result, flags, warnings = aliases(f"--backend={ours}", f"--remote-runtime-service-endpoint={theirs}")
    assert result.exit_code == 0, result.output
    assert flags["backend"] == ours  # --backend as given
    assert warnings == [f"--remote-runtime-service-endpoint is deprecated: use --backend {theirs}"]


def test_what_the_proxy_does_anyway_is_accepted_with_a_warning() -> None:
    result, flags, warnings = aliases(
        "--backend-runtime-mode=Containerd",
        "--runtime-hook-server-key=runtimeproxy.koordinator.sh/skip-hookserver",
        "--runtime-hook-server-val=true",
    )
    assert result.exit_code == 0, result.output
    assert flags == {"listen": None, "backend": None, "image_backend": None}
    assert warnings == [
        "--backend-runtime-mode=Containerd is deprecated: it is what the proxy does; remove it",
        "--runtime-hook-server-key=runtimeproxy.koordinator.sh/skip-hookserver is deprecated: it is what the proxy does; remove it",
        "--runtime-hook-server-val=true is deprecated: it is what the proxy does; remove it",
    ]


def test_the_rest_is_refused_all_at_once_naming_why() -> None:
    result = serve(
        "--remote-runtime-service-endpoint=/run/containerd/containerd.sock",
        "--backend-runtime-mode=Docker",
        "--runtime-hook-server-key=runtimeproxy.koordinator.sh/is-hookserver",
        "--runtime-hook-server-val=yes",
    )
    assert result.exit_code == 2
    assert "--backend-runtime-mode=Docker: none: the proxy speaks CRI to any CRI runtime; Docker mode is not supported" in result.output
    assert "--runtime-hook-server-key=runtimeproxy.koordinator.sh/is-hookserver: none: pods labelled" in result.output
    assert "--runtime-hook-server-val=yes: none" in result.output
    assert "remote-runtime-service-endpoint" not in result.output  # taken: not a refusal
    assert "docs/migrating-from-koord-runtime-proxy.md" in result.output


def test_serve_takes_the_aliases_as_its_own_flags() -> None:
    # The same socket to listen on and to forward to: refused as --listen
    # and --backend would be, so the aliases reached the settings.
    result = serve(
        "--koord-runtimeproxy-endpoint=/run/x/proxy.sock", "--remote-runtime-service-endpoint=/run/x/proxy.sock"
    )
    assert result.exit_code == 1
    assert "listen and backend are the same socket" in result.output


def test_every_koord_flag_is_known_and_hidden() -> None:
    for flag in KOORD_FLAGS:
        if KOORD_FLAGS[flag].ours is None:
            result = serve(f"{flag}=x")
            assert result.exit_code == 2 and f"{flag}=x: " in result.output, flag
    assert not any(flag in serve("--help").output for flag in KOORD_FLAGS)


def test_another_image_socket_than_the_runtimes_is_warned_of_as_applied() -> None:
    # koord-runtime-proxy v1.4 and later ignored the flag: image calls went to the runtime's socket.
    seen: dict[str, Any] = {}

    @click.command()
    @click.option("--backend", type=SOCKET)
    @click.option("--image-backend", type=SOCKET)
    @koord_flags
    def command(backend: Path | None, image_backend: Path | None) -> None:
        seen["moved"] = image_calls_moved(click.get_current_context(), backend)

    def moved(*args: str) -> str | None:
        result = CliRunner().invoke(command, list(args))
        assert result.exit_code == 0, result.output
        return seen["moved"]  # type: ignore[no-any-return]

    assert moved(
        "--backend=/run/containerd/containerd.sock", "--remote-image-service-endpoint=/run/images.sock"
    ) == (
        "--remote-image-service-endpoint=/run/images.sock is applied: image calls now go to /run/images.sock,"
        " not to the runtime's socket /run/containerd/containerd.sock, unlike koord-runtime-proxy v1.4 and later,"
        " which ignored this flag and sent them to the runtime endpoint; remove it to keep them there"
    )
    # koord-runtime-proxy's defaults: the same socket, /var/run a link to /run where it is one.
    same = "/var/run/containerd/containerd.sock" if Path("/var/run").resolve() == Path("/run") else "/run/containerd/containerd.sock"
    assert moved("--backend=/run/containerd/containerd.sock", f"--remote-image-service-endpoint={same}") is None
    assert moved("--backend=/run/containerd/containerd.sock") is None


def test_serve_warns_that_image_calls_go_to_another_socket(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def fake_serve(config: Any, local_dir: Path | None) -> None:
        pass

    monkeypatch.setattr(cli, "_serve", fake_serve)
    monkeypatch.setattr(cli.logs, "setup", lambda fmt, level: None)  # keep pytest's log capture
    result = serve("--remote-image-service-endpoint=/run/images.sock")
    assert result.exit_code == 0, result.output
    [line] = [r for r in caplog.records if r.getMessage() == "image calls go to another socket than koord-runtime-proxy sent them to"]
    assert line.levelno == logging.WARNING
    assert "image calls now go to /run/images.sock" in line.warning  # type: ignore[attr-defined]


def test_a_mode_other_than_docker_is_refused_naming_the_accepted_value() -> None:
    result = serve("--backend-runtime-mode=containerd")
    assert result.exit_code == 2
    assert "--backend-runtime-mode=containerd: none: the proxy speaks CRI to any CRI runtime; only Containerd is accepted" in result.output
    assert "Docker" not in result.output
