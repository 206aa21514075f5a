"""``runtime-proxy serve`` given koord-runtime-proxy's flags, as a unit carried
over from it passes them: refused, each named with what replaces it."""

from __future__ import annotations

from click.testing import CliRunner

from runtimeproxy.cli import main
from runtimeproxy.koordflags import KOORD_FLAGS


def serve(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["serve", *args])


def test_each_koord_flag_is_refused_naming_its_replacement() -> None:
    result = serve(
        "--remote-runtime-service-endpoint=/run/containerd/containerd.sock",
        "--koord-runtimeproxy-endpoint", "/var/run/koord-runtimeproxy/runtimeproxy.sock",
        "--backend-runtime-mode=Containerd",
        "--runtime-hook-server-key=runtimeproxy.koordinator.sh/skip-hookserver",
    )
    assert result.exit_code == 2
    assert "--backend /run/containerd/containerd.sock" in result.output
    assert "--listen /var/run/koord-runtimeproxy/runtimeproxy.sock" in result.output
    assert "--backend-runtime-mode=Containerd: none: the proxy speaks CRI" in result.output
    assert "skip-hookserver=true are never hooked" in result.output
    assert "docs/migrating-from-koord-runtime-proxy.md" in result.output


def test_every_koord_flag_is_known_and_hidden() -> None:
    for flag in KOORD_FLAGS:
        result = serve(f"{flag}=x")
        assert result.exit_code == 2 and f"{flag}=x: " in result.output, flag
    assert not any(flag in serve("--help").output for flag in KOORD_FLAGS)
