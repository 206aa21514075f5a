"""A socket path with a comma: grpc binds it, but reads a comma in a unix:
target as a separator between two addresses, %2C too, and dials elsewhere.
Such a path is refused where it is given (a setting, a hook file's
remote-endpoint, --local-containerd's directory), and grpc_target never
makes a target of one (host/unixsocket.py's dial_problem)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from runtimeproxy import cli
from runtimeproxy.checkconfig import Severity, check
from runtimeproxy.config import ConfigError, ProxyConfig, load
from runtimeproxy.hookpath.hookfile import HookConfigError, parse_hook_document
from runtimeproxy.host.containerd import LocalContainerd, LocalRuntimeError
from runtimeproxy.host.unixsocket import COMMA_REASON, UndialablePath, grpc_address, grpc_target


async def test_grpc_binds_a_path_with_a_comma_but_dials_elsewhere_even_quoted(tmp_path: Path) -> None:
    """Why the refusal: if a grpc to come dials it, this fails, and the refusal can go."""
    path = tmp_path / "a,b.sock"
    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    assert server.add_insecure_port(grpc_address(path)) != 0
    await server.start()
    try:
        assert [p.name for p in tmp_path.iterdir()] == ["a,b.sock"]  # bound as written
        quoted = "unix://" + urllib.parse.quote(str(path))
        assert "%2C" in quoted
        async with aio.insecure_channel(quoted) as channel:
            with pytest.raises(aio.AioRpcError) as failed:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert "unix:b.sock" in str(failed.value.details())  # the second "address": b.sock in the current directory
    finally:
        await server.stop(None)


def test_grpc_target_refuses_a_path_with_a_comma(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UndialablePath) as refused:
        grpc_target(tmp_path / "a,b.sock")
    assert str(refused.value) == f"{COMMA_REASON}: {tmp_path / 'a,b.sock'}"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x,y").mkdir()
    monkeypatch.chdir(tmp_path / "x,y")
    with pytest.raises(UndialablePath):  # a relative path is dialled from the current directory
        grpc_target("p.sock")


@pytest.mark.parametrize("key", ["listen", "backend", "image-backend"])
def test_a_socket_setting_with_a_comma_is_refused_at_its_line_by_serve_and_check_config(
    tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[object] = []
    monkeypatch.setattr(cli, "_serve", lambda *args: started.append(args))
    monkeypatch.setattr(cli.logs, "setup", lambda fmt, level: None)
    config = tmp_path / "config.yaml"
    others = {"listen": "/run/p.sock", "backend": "/run/c.sock", "image-backend": "/run/i.sock"}
    config.write_text(f"hook-dir: {tmp_path}\n{key}: /run/a,b.sock\n"
                      + "".join(f"{k}: {v}\n" for k, v in others.items() if k != key))
    message = f"config file {config}: {key} '/run/a,b.sock': {COMMA_REASON} (line 2)"
    with pytest.raises(ConfigError) as refused:
        load(config)
    assert (str(refused.value), refused.value.line) == (message, 2)
    result = CliRunner().invoke(cli.main, ["serve", "--config", str(config)])
    assert result.exit_code == 1
    assert f"Error: {message}" in " ".join(result.output.split())
    assert started == []
    (finding,) = [f for f in check(config, tmp_path).findings if f.severity is Severity.ERROR]
    assert (finding.subject, finding.line, finding.reason) == (config, 2, message)


@pytest.mark.parametrize("flag", ["--listen", "--backend", "--image-backend"])
@pytest.mark.parametrize("written", ["/run/a,b.sock", "unix:///run/a,b.sock"])
def test_a_socket_flag_with_a_comma_is_refused(flag: str, written: str, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(cli, "_serve", lambda *args: started.append(args))
    result = CliRunner().invoke(cli.main, ["serve", flag, written])
    assert result.exit_code == 1
    # A URL flag is its path by then (clipath's SOCKET)
    assert f"Error: {flag[2:]} '/run/a,b.sock': {COMMA_REASON}" in " ".join(result.output.split())
    assert started == []


def test_a_socket_path_without_a_comma_still_loads(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("listen: /run/a;b.sock\nbackend: /run/c d.sock\n")
    assert load(config) == ProxyConfig(listen=Path("/run/a;b.sock"), backend=Path("/run/c d.sock"))


def test_a_hook_file_s_endpoint_with_a_comma_is_refused(tmp_path: Path) -> None:
    doc = json.loads('{"remote-endpoint": "/run/hooks/a,b.sock", "runtime-hooks": ["PreRunPodSandbox"]}')
    with pytest.raises(HookConfigError) as refused:
        parse_hook_document(tmp_path / "h.json", doc)
    assert refused.value.reason == f"\"remote-endpoint\" '/run/hooks/a,b.sock': {COMMA_REASON}"


async def test_local_containerd_refuses_a_directory_with_a_comma(tmp_path: Path) -> None:
    base = tmp_path / "ctr,d"
    with pytest.raises(LocalRuntimeError) as refused:
        await LocalContainerd(base).start()
    assert str(refused.value) == f"cannot use {base} as containerd's directory: {COMMA_REASON}"
    assert not base.exists()  # refused before anything was made


def test_status_of_a_listen_path_with_a_comma_says_it_cannot_dial_it() -> None:
    result = CliRunner().invoke(cli.main, ["status", "--listen", "/run/a,b.sock"])
    assert result.exit_code == 1
    assert (f"Error: cannot get the status from the proxy at /run/a,b.sock: {COMMA_REASON}: /run/a,b.sock"
            in " ".join(result.output.split()))
