"""check-config on metrics-listen: the host looked up and the address tried
on port 0, as serve's bind would meet them (tcplisten.py); the port is not."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy import tcplisten
from runtimeproxy.checkconfig import Finding, Severity, check
from ..prerequisites import LINK_LOCAL_ADDRESS, LINK_LOCAL_INTERFACE, foreign_address, in_network_namespace


def metrics_config(tmp_path: Path, address: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"listen: {tmp_path / 'p.sock'}\nlog-level: info\nmetrics-listen: \"{address}\"\n")
    return path


def metrics_findings(path: Path) -> list[Finding]:
    return [f for f in check(path, path.parent).findings if "metrics-listen" in f.reason]


def answer_with(monkeypatch: pytest.MonkeyPatch, code: int, message: str) -> None:
    def lookup(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(code, message)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)  # no resolver asked: the answer it would give


def test_a_name_that_does_not_resolve_is_an_error_at_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answer_with(monkeypatch, socket.EAI_NONAME, "Name or service not known")
    path = metrics_config(tmp_path, "node-9.invalid:9464")
    (finding,) = metrics_findings(path)
    assert (finding.severity, finding.subject, finding.line) == (Severity.ERROR, path, 3)
    assert finding.reason == ("metrics-listen 'node-9.invalid:9464': 'node-9.invalid' does not resolve (a lookup): "
                              "Name or service not known (EAI_NONAME)")
    assert not check(path, path.parent).ok


def test_a_resolver_that_fails_for_now_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answer_with(monkeypatch, socket.EAI_AGAIN, "Temporary failure in name resolution")
    (finding,) = metrics_findings(metrics_config(tmp_path, "metrics.node.example:9464"))
    assert finding.severity is Severity.WARNING
    assert finding.reason.endswith("Temporary failure in name resolution (EAI_AGAIN)")


@pytest.fixture
def unanswered(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """A resolver that answers only once the test is over."""
    release = threading.Event()
    real = socket.getaddrinfo

    def lookup(*args: object, **kwargs: object) -> object:
        release.wait()
        return real("127.0.0.1", 0)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(tcplisten, "LOOKUP_SECONDS", 0.05)
    yield release
    release.set()


def test_a_lookup_without_an_answer_in_time_is_a_warning(tmp_path: Path, unanswered: threading.Event) -> None:
    (finding,) = metrics_findings(metrics_config(tmp_path, "metrics.node.example:9464"))
    assert finding.severity is Severity.WARNING
    assert "looking up 'metrics.node.example' gave no answer within 0.05s" in finding.reason


def test_an_address_not_of_this_host_is_an_error(tmp_path: Path) -> None:
    address = foreign_address()
    (finding,) = metrics_findings(metrics_config(tmp_path, f"{address}:9464"))
    assert finding.severity is Severity.ERROR
    assert finding.reason == (f"metrics-listen '{address}:9464': cannot bind '{address}': "
                              "Cannot assign requested address (EADDRNOTAVAIL)")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0.0.0.0", "[::]", "[::1]"])
def test_an_address_of_this_host_has_no_finding_whoever_holds_its_port(tmp_path: Path, host: str) -> None:
    """The port is not tried: the running proxy holds its own, and nothing tells it from another process."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert metrics_findings(metrics_config(tmp_path, f"{host}:{taken.getsockname()[1]}")) == []


# Run in a network namespace of its own: prints the findings' reasons, as JSON.
CHECK_THERE = """
import json, sys, tempfile
from pathlib import Path
from runtimeproxy.checkconfig import check

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "config.yaml"
    path.write_text(f"listen: {tmp}/p.sock\\nmetrics-listen: \\"{sys.argv[1]}\\"\\n")
    print(json.dumps([f.reason for f in check(path, path.parent).findings if "metrics-listen" in f.reason]))
"""


def test_a_scoped_link_local_address_of_this_host_has_no_finding() -> None:
    """serve binds the scope id getaddrinfo gives (an error before: prometheus_client dropped it, EINVAL)."""
    address = f"[{LINK_LOCAL_ADDRESS}%{LINK_LOCAL_INTERFACE}]:9464"
    assert json.loads(in_network_namespace(CHECK_THERE, args=[address])) == []
    assert json.loads(in_network_namespace(CHECK_THERE, args=[f"[{LINK_LOCAL_ADDRESS}]:9464"])) == [
        f"metrics-listen '[{LINK_LOCAL_ADDRESS}]:9464': cannot bind '{LINK_LOCAL_ADDRESS}': "
        "Invalid argument (EINVAL)"]  # the same address without its scope: what check-config met before


def test_a_scope_naming_no_interface_is_an_error_that_says_so(tmp_path: Path) -> None:
    (finding,) = metrics_findings(metrics_config(tmp_path, "[fe80::1%nosuchif0]:9464"))
    assert finding.severity is Severity.ERROR
    assert finding.reason == ("metrics-listen '[fe80::1%nosuchif0]:9464': 'fe80::1%nosuchif0' does not resolve "
                              "(a lookup): Name or service not known (EAI_NONAME): "
                              "no interface 'nosuchif0' on this host")


def test_a_scope_with_a_nul_names_no_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form refuses it (config.py); the lookup's words no longer raise
    ValueError naming its interface (check-config crashed)."""
    answer_with(monkeypatch, socket.EAI_NONAME, "Name or service not known")
    problem = tcplisten.check_listen("fe80::1%\0", 9464)
    assert problem == tcplisten.ListenProblem(
        True, "'fe80::1%\\x00' does not resolve (a lookup): Name or service not known (EAI_NONAME): "
              "no interface '\\x00' on this host")
