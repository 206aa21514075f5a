"""systemd/runtime-proxy.service, .socket and the kubelet drop-in: valid for
systemd, and agreeing with each other and with what the proxy does."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ...prerequisites import fail_or_skip

REPO = Path(__file__).resolve().parents[3]
SYSTEMD = REPO / "systemd"
RUNNER = Path(sys.executable).parent / "runtime-proxy"


def parse(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text().replace("\\\n", " "))
    return parser


def units_in(directory: Path) -> list[Path]:
    """The units as installed, with a stand-in kubelet.service for the drop-in."""
    service = directory / "runtime-proxy.service"
    service.write_text((SYSTEMD / "runtime-proxy.service").read_text().replace("/usr/local/bin/runtime-proxy", str(RUNNER)))
    shutil.copy(SYSTEMD / "runtime-proxy.socket", directory)
    shutil.copytree(SYSTEMD / "kubelet.service.d", directory / "kubelet.service.d")
    kubelet = directory / "kubelet.service"
    kubelet.write_text("[Unit]\nDescription=kubelet\n[Service]\nExecStart=/bin/true $KUBELET_EXTRA_ARGS\n")
    return [service, directory / "runtime-proxy.socket", kubelet]


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        fail_or_skip("systemd-analyze is not installed on this machine (scripts/setup.sh installs it)")
    assert RUNNER.exists()
    units = units_in(tmp_path)
    result = subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values; it only warns.
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def test_service_settings() -> None:
    service = parse(SYSTEMD / "runtime-proxy.service")["Service"]
    # always: a clean exit (a stray SIGTERM or SIGHUP) still leaves kubelet without a runtime.
    assert (service["Type"], service["Restart"]) == ("notify", "always")
    assert 10 <= int(service["WatchdogSec"]) <= 120
    assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
    assert service["ProtectHome"] == "yes" and service["PrivateTmp"] == "yes"
    # The socket directory of the example config is writable.
    listen = Path(yaml.safe_load((SYSTEMD / "config.yaml").read_text())["listen"])
    writable = [Path(p.lstrip("-")) for p in service["ReadWritePaths"].split()]
    assert any(Path(os.path.realpath(listen.parent)) == Path(os.path.realpath(p)) for p in writable), writable


# systemd's DefaultStartLimitIntervalSec and DefaultStartLimitBurst.
DEFAULT_START_LIMIT = (10.0, 5)


@pytest.mark.parametrize("unit", ["runtime-proxy.service", "runtime-proxy-nri.service"])
def test_restart_always_is_never_given_up(unit: str) -> None:
    # systemd stops restarting a unit started `burst` times within `interval`
    # ("start request repeated too quickly"): a proxy exiting at once for a
    # few seconds would stay down, kubelet without a runtime.
    parsed = parse(SYSTEMD / unit)
    assert parsed["Service"]["Restart"] == "always"
    interval = float(parsed["Unit"].get("StartLimitIntervalSec", DEFAULT_START_LIMIT[0]))
    burst = int(parsed["Unit"].get("StartLimitBurst", DEFAULT_START_LIMIT[1]))
    restart_every = float(parsed["Service"]["RestartSec"])
    assert interval == 0 or burst * restart_every > interval, (interval, burst, restart_every)


def test_the_proxy_and_the_nri_plugin_never_run_together() -> None:
    # Both serve the same hook directory: with both, every hook would run twice.
    assert parse(SYSTEMD / "runtime-proxy.service")["Unit"]["Conflicts"] == "runtime-proxy-nri.service"
    assert parse(SYSTEMD / "runtime-proxy-nri.service")["Unit"]["Conflicts"] == "runtime-proxy.service"


def test_socket_is_the_endpoint_kubelet_and_the_proxy_use() -> None:
    socket = parse(SYSTEMD / "runtime-proxy.socket")["Socket"]
    assert socket["SocketMode"] == "0660"
    assert parse(SYSTEMD / "runtime-proxy.socket")["Unit"]["Before"] == "kubelet.service"
    path = os.path.realpath(socket["ListenStream"])
    listen = yaml.safe_load((SYSTEMD / "config.yaml").read_text())["listen"]
    assert os.path.realpath(listen) == path
    args = parse(SYSTEMD / "kubelet.service.d" / "10-runtime-proxy.conf")["Service"]["Environment"].strip('"')
    flags = dict(arg.split("=", 1) for arg in args.removeprefix("KUBELET_EXTRA_ARGS=").split())
    assert set(flags) == {"--container-runtime-endpoint", "--image-service-endpoint"}
    assert {os.path.realpath(v.removeprefix("unix://")) for v in flags.values()} == {path}
