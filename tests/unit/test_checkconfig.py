"""check-config's checker: serve's rules applied to a config file and a hook
directory, every bad file named with its reason (and line), warnings apart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy import checkconfig, checkhooks
from runtimeproxy.checkconfig import Finding, Severity, check
from runtimeproxy.config import ConfigError, load
from runtimeproxy.hookpath.points import HookType

from ..configcases import BAD_METRICS_HOSTS, SERVE_CRASHERS
from ..hookprocs import NOBODY, dir_for_nobody, served_by_nobody
from ..prerequisites import fail_or_skip


@pytest.fixture
def live(sock_dir: Path) -> Iterator[Path]:
    """A socket someone listens on."""
    path = sock_dir / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen()
        yield path


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    path = tmp_path / "hooks"
    path.mkdir(mode=0o755)
    path.chmod(0o755)  # whatever the umask
    return path


def hook_file(directory: Path, name: str, text: str | dict[str, object], mode: int = 0o644) -> Path:
    path = directory / name
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    path.chmod(mode)
    return path


def valid_hook(endpoint: Path, **extra: object) -> dict[str, object]:
    return {"remote-endpoint": str(endpoint), "failure-policy": "Fail", "runtime-hooks": ["PreCreateContainer"], **extra}


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def good_config(tmp_path: Path, backend: Path, hook_dir: Path) -> Path:
    return config_file(
        tmp_path, f"listen: {tmp_path / 'proxy.sock'}\nbackend: {backend}\nhook-dir: {hook_dir}\nserve-versions: auto\n"
    )


def only(findings: tuple[Finding, ...], severity: Severity) -> list[Finding]:
    return [f for f in findings if f.severity is severity]


# --------------------------------------------------------------------------- all valid


def test_valid_config_and_hook_directory_have_no_findings(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    hook_file(hook_dir, "a.json", valid_hook(live, timeout="1s", priority=3))
    report = check(good_config(tmp_path, live, hook_dir))
    assert report.findings == ()
    assert report.ok
    assert [s.name for s in report.servers] == ["a.json"]
    assert report.servers[0].timeout == 1.0 and report.servers[0].priority == 3
    assert list(report.lines())[-1] == "0 error(s), 0 warning(s)"


def test_hook_dir_defaults_to_the_configs(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    hook_file(hook_dir, "bad.json", "{")
    report = check(good_config(tmp_path, live, hook_dir))
    assert report.hook_dir == hook_dir
    assert [f.subject for f in report.findings] == [hook_dir / "bad.json"]


def test_hook_dir_flag_wins_over_the_config(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    other.chmod(0o755)
    hook_file(hook_dir, "bad.json", "{")
    report = check(good_config(tmp_path, live, hook_dir), other)
    assert report.hook_dir == other
    assert report.findings == ()


def test_no_config_file_checks_the_defaults() -> None:
    report = check(None)
    assert report.config == load(None)
    assert report.hook_dir == Path("/etc/runtime/hookserver.d")


# --------------------------------------------------------------------------- config file errors


def test_bad_yaml_is_an_error_with_its_line(tmp_path: Path) -> None:
    path = config_file(tmp_path, "listen: /tmp/p.sock\nbackend: [unclosed\nlog-level: info\n")
    report = check(path)
    (finding,) = only(report.findings, Severity.ERROR)
    assert finding.subject == path
    assert finding.line == 3  # where the parser found the flow sequence unclosed
    assert "cannot read config file" in finding.reason
    assert not report.ok and report.config is None


def test_unknown_yaml_key_is_an_error_with_its_line(tmp_path: Path) -> None:
    path = config_file(tmp_path, "listen: /tmp/p.sock\n\nbackends: /tmp/typo.sock\n")
    (finding,) = only(check(path).findings, Severity.ERROR)
    assert (finding.severity, finding.subject, finding.line) == (Severity.ERROR, path, 3)
    assert "unknown setting 'backends' (did you mean 'backend'?) (line 3)" in finding.reason


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("log-level: info\nserve-versions: v3\n", 2, "serve-versions 'v3'"),
        ("serve-versions: [v1, v9]\n", 1, "serve-versions 'v1,v9'"),
        ("log-level: loud\n", 1, "log-level 'loud': expected one of"),
        ("grace_period: -1\n", 1, "grace-period -1: expected a number of seconds"),
    ],
)
def test_bad_values_are_errors_with_their_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = config_file(tmp_path, text)
    (finding,) = only(check(path).findings, Severity.ERROR)
    assert (finding.severity, finding.line) == (Severity.ERROR, line)
    assert fragment in finding.reason


@pytest.mark.parametrize(("text", "fragment"), SERVE_CRASHERS + BAD_METRICS_HOSTS)
def test_what_serve_cannot_run_with_is_an_error_as_serve_reports_it(
    tmp_path: Path, hook_dir: Path, text: str, fragment: str
) -> None:
    path = config_file(tmp_path, "log-level: info\n" + text)
    # With --hook-dir: the directory is checked as well, and the file still judged.
    report = check(path, hook_dir)
    (finding,) = only(report.findings, Severity.ERROR)  # (the default backend's socket may be missing: a warning)
    assert (finding.severity, finding.subject, finding.line) == (Severity.ERROR, path, 2)
    assert fragment in finding.reason
    with pytest.raises(ConfigError) as err:
        load(path)  # serve's loader: the same words
    assert finding.reason == str(err.value)
    assert not report.ok and report.config is None and report.hook_dir == hook_dir
    assert list(report.lines())[-1].startswith("1 error(s), ")


def test_config_error_line_is_what_serve_reports(tmp_path: Path) -> None:
    # The checker calls serve's loader: the same error, the same words.
    path = config_file(tmp_path, "listen: /tmp/p.sock\nserve-versions: v3\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    (finding,) = only(check(path).findings, Severity.ERROR)
    assert finding.reason == str(err.value) and finding.line == err.value.line == 2


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    (finding,) = check(tmp_path / "absent.yaml").findings
    assert finding.severity is Severity.ERROR and "cannot read config file" in finding.reason


# --------------------------------------------------------------------------- config sockets


def test_missing_backend_socket_is_a_warning(tmp_path: Path, hook_dir: Path) -> None:
    report = check(good_config(tmp_path, tmp_path / "gone.sock", hook_dir))
    (finding,) = report.findings
    assert finding.severity is Severity.WARNING and finding.subject == tmp_path / "gone.sock"
    assert "backend: socket does not exist" in finding.reason
    assert report.ok


def test_backend_that_is_not_a_socket_is_an_error(tmp_path: Path, hook_dir: Path) -> None:
    regular = tmp_path / "containerd.sock"
    regular.write_text("")
    (finding,) = check(good_config(tmp_path, regular, hook_dir)).findings
    assert (finding.severity, finding.subject) == (Severity.ERROR, regular)
    assert "not a unix socket" in finding.reason


def test_listen_path_that_is_not_a_socket_is_an_error(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    (tmp_path / "proxy.sock").mkdir()
    (finding,) = check(good_config(tmp_path, live, hook_dir)).findings
    assert (finding.severity, finding.subject) == (Severity.ERROR, tmp_path / "proxy.sock")


def listen_config(tmp_path: Path, listen: Path, backend: Path, hook_dir: Path) -> Path:
    return config_file(tmp_path, f"listen: {listen}\nbackend: {backend}\nhook-dir: {hook_dir}\n")


LISTEN_REFUSED = {
    "longer than sun_path": (lambda d, live: d / ("x" * 120) / "p.sock", "unix socket path too long"),
    "below a regular file": (lambda d, live: d / "file" / "sub" / "p.sock", "is not a directory"),
    "a symlink to a live socket": (lambda d, live: d / "link.sock", "is a symbolic link, not a unix socket"),
}


@pytest.mark.parametrize("case", LISTEN_REFUSED, ids=list(LISTEN_REFUSED))
def test_a_listen_path_serve_refuses_is_an_error_naming_it(
    tmp_path: Path, live: Path, hook_dir: Path, case: str
) -> None:
    (tmp_path / "file").write_text("precious")
    (tmp_path / "link.sock").symlink_to(live)
    make, reason = LISTEN_REFUSED[case]
    listen = make(tmp_path, live)
    report = check(listen_config(tmp_path, listen, live, hook_dir))
    (finding,) = report.findings  # a symlink to the backend's socket is the bind's error only
    assert (finding.severity, finding.subject) == (Severity.ERROR, listen)
    assert finding.reason.startswith("listen: ") and str(listen) in finding.reason and reason in finding.reason
    assert not report.ok
    # Checked, not prepared: nothing made, nothing removed.
    assert (tmp_path / "file").read_text() == "precious" and (tmp_path / "link.sock").is_symlink()
    assert not (tmp_path / ("x" * 120)).exists()


def test_a_listen_path_serve_can_use_changes_nothing_on_disk(sock_dir: Path, live: Path, hook_dir: Path) -> None:
    stale = sock_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.bind(str(stale))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as runtime:
        runtime.bind(str(sock_dir / "runtime.sock"))
        runtime.listen()  # a runtime nobody listens on is a warning of its own
        for listen in (sock_dir / "new" / "proxy.sock", stale, live):  # live: the running proxy's own
            report = check(listen_config(sock_dir, listen, sock_dir / "runtime.sock", hook_dir))
            assert report.findings == (), listen
    assert not (sock_dir / "new").exists() and stale.is_socket()  # serve would make the one, remove the other


# --------------------------------------------------------------------------- hook files


def test_bad_json_names_the_file_and_the_line(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    path = hook_file(hook_dir, "broken.json", '{\n  "remote-endpoint": "/run/x.sock",\n  "runtime-hooks": [}\n')
    report = check(good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert (finding.severity, finding.subject) == (Severity.ERROR, path)
    assert "invalid JSON" in finding.reason and "line 3 column 21" in finding.reason
    assert not report.ok


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"runtime-hooks": ["PreStopContainer"]}, "unknown runtime hook 'PreStopContainer'"),
        ({"timeout": "2 seconds"}, 'bad "timeout"'),
        ({"timeout": "0s"}, "must be greater than zero"),
        ({"timeout": "5m"}, "more than the limit"),
        ({"failure-policy": "Retry"}, 'unknown "failure-policy"'),
        ({"priority": "high"}, '"priority" must be an integer'),
        ({"remote-endpoint": "relative.sock"}, "must be an absolute socket path"),
    ],
)
def test_invalid_hook_file_is_an_error_with_serves_reason(
    tmp_path: Path, live: Path, hook_dir: Path, extra: dict[str, object], fragment: str
) -> None:
    path = hook_file(hook_dir, "h.json", valid_hook(live, **extra))
    report = check(good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert (finding.severity, finding.subject) == (Severity.ERROR, path)
    assert fragment in finding.reason
    assert report.servers == ()


def test_group_writable_hook_file_is_refused(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    path = hook_file(hook_dir, "loose.json", valid_hook(live), mode=0o664)
    (finding,) = check(good_config(tmp_path, live, hook_dir)).findings
    assert (finding.severity, finding.subject) == (Severity.ERROR, path)
    assert "refused" in finding.reason and "writable by group" in finding.reason


def test_unsafe_hook_directory_is_an_error(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    hook_file(hook_dir, "a.json", valid_hook(live))
    hook_dir.chmod(0o777)
    report = check(good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert (finding.severity, finding.subject) == (Severity.ERROR, hook_dir)
    assert "refusing to load any hook" in finding.reason
    assert report.servers == ()  # serve would load none


def test_missing_hook_directory_is_a_warning(tmp_path: Path, live: Path) -> None:
    report = check(good_config(tmp_path, live, tmp_path / "absent"))
    (finding,) = report.findings
    assert finding.severity is Severity.WARNING and "does not exist" in finding.reason
    assert report.ok


def test_hook_directory_that_is_a_file_is_an_error(tmp_path: Path, live: Path) -> None:
    (tmp_path / "file").write_text("")
    (finding,) = check(good_config(tmp_path, live, tmp_path / "file")).findings
    assert finding.severity is Severity.ERROR and "is not a directory" in finding.reason


def test_every_bad_file_is_named_and_good_ones_still_load(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    hook_file(hook_dir, "a.json", valid_hook(live))
    hook_file(hook_dir, "b.json", "[]")
    hook_file(hook_dir, "c.json", valid_hook(live, timeout=5))
    hook_file(hook_dir, "notes.txt", "not a hook file: serve skips it")
    report = check(good_config(tmp_path, live, hook_dir))
    assert [(f.severity, f.subject.name) for f in report.findings] == [
        (Severity.ERROR, "b.json"), (Severity.ERROR, "c.json")
    ]
    assert [s.name for s in report.servers] == ["a.json"]


# --------------------------------------------------------------------------- hook warnings


def test_missing_hook_endpoint_is_a_warning(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    path = hook_file(hook_dir, "a.json", valid_hook(tmp_path / "down.sock"))
    report = check(good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert (finding.severity, finding.subject) == (Severity.WARNING, path)
    assert "socket does not exist" in finding.reason and str(tmp_path / "down.sock") in finding.reason
    assert report.ok


def test_hook_endpoint_nobody_listens_on_is_a_warning(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    """A killed hook server leaves its socket: check-config said the file was valid, while a
    Fail hook refused every pod's containers with `Connection refused`."""
    left = tmp_path / "left.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(left))  # bound, not listening: what a killed server leaves
        path = hook_file(hook_dir, "a.json", valid_hook(left))
        report = check(good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert (finding.severity, finding.subject) == (Severity.WARNING, path)
    assert "remote-endpoint: nobody listens on this socket (left behind by a server" in finding.reason
    assert str(left) in finding.reason
    assert report.ok and [s.name for s in report.servers] == ["a.json"]


def test_hook_endpoint_that_is_not_a_socket_is_an_error(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    regular = tmp_path / "hook.sock"
    regular.write_text("")
    path = hook_file(hook_dir, "a.json", valid_hook(regular))
    report = check(good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert (finding.severity, finding.subject) == (Severity.ERROR, path)
    assert "remote-endpoint: exists and is not a unix socket" in finding.reason
    assert not report.ok


def test_hook_file_registering_nothing_is_a_warning(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    hook_file(hook_dir, "a.json", valid_hook(live, **{"runtime-hooks": []}))
    (finding,) = check(good_config(tmp_path, live, hook_dir)).findings
    assert finding.severity is Severity.WARNING and "registers no runtime hooks" in finding.reason


def test_koordlets_never_called_hook_point_is_a_warning(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    hook_file(hook_dir, "koordlet.json", valid_hook(live, **{"runtime-hooks": ["PreCreateContainer", "PreRemoveRunPodSandbox"]}))
    report = check(good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert finding.severity is Severity.WARNING and "PreRemoveRunPodSandbox is never called" in finding.reason
    assert report.ok


def test_unknown_hook_file_key_is_a_warning(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    hook_file(hook_dir, "a.json", valid_hook(live, timout="1s"))
    (finding,) = check(good_config(tmp_path, live, hook_dir)).findings
    assert finding.severity is Severity.WARNING and "timout" in finding.reason


def test_hook_point_the_proxy_never_calls_is_a_warning(
    tmp_path: Path, live: Path, hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every hook point is called today; a point dropped from the hook stage must show.
    hooked = dict(checkhooks.HOOKED_METHODS)
    del hooked["UpdateContainerResources"]
    monkeypatch.setattr(checkhooks, "HOOKED_METHODS", hooked)
    hooks = ["PreCreateContainer", HookType.PRE_UPDATE_CONTAINER_RESOURCES.value]
    hook_file(hook_dir, "a.json", valid_hook(live, **{"runtime-hooks": hooks}))
    (finding,) = check(good_config(tmp_path, live, hook_dir)).findings
    assert finding.severity is Severity.WARNING
    assert "PreUpdateContainerResources is never called" in finding.reason


def test_every_hook_point_is_called_today() -> None:
    assert all(checkhooks._proxy_calls(hook) for hook in HookType)


def test_finding_text_names_file_and_line() -> None:
    finding = Finding(Severity.ERROR, Path("/etc/c.yaml"), "bad", 4)
    assert str(finding) == "error: /etc/c.yaml:4: bad"
    assert str(Finding(Severity.WARNING, Path("/d"), "odd")) == "warning: /d: odd"


def test_balloons_called_before_another_container_hook_is_a_warning(tmp_path: Path, live: Path, hook_dir: Path) -> None:
    """balloons sizes by the cpu_shares it is shown; batchresource after it sets others."""
    hooks = {"runtime-hooks": ["PreCreateContainer", "PreUpdateContainerResources"]}
    hook_file(hook_dir, "balloons.json", valid_hook(live, **hooks))
    hook_file(hook_dir, "batchresource.json", valid_hook(live, **hooks))
    hook_file(hook_dir, "pods.json", valid_hook(live, **{"runtime-hooks": ["PreRunPodSandbox"]}))  # no container hook
    (finding,) = check(good_config(tmp_path, live, hook_dir)).findings
    assert finding.severity is Severity.WARNING and finding.subject == hook_dir / "balloons.json"
    assert "called before batchresource.json, which may set cpu_shares balloons would not see" in finding.reason
    hook_file(hook_dir, "balloons.json", valid_hook(live, priority=100, **hooks))  # as `hook run balloons` writes it
    assert check(good_config(tmp_path, live, hook_dir)).findings == ()


# A stop takes the grace period plus STOP_PAST_GRACE_S: past the unit's
# TimeoutStopSec systemd kills it.
@pytest.mark.parametrize(("grace", "warned"), [(12.5, False), (13, True)])
def test_a_grace_period_the_units_stop_timeout_cuts_short_is_a_warning(
    tmp_path: Path, live: Path, hook_dir: Path, grace: float, warned: bool
) -> None:
    path = config_file(tmp_path, f"listen: {tmp_path}/proxy.sock\nbackend: {live}\nhook-dir: {hook_dir}\ngrace-period: {grace}\n")
    report = check(path)
    expected = [
        Finding(
            Severity.WARNING, path,
            "grace-period 13: a stop takes the grace period plus 7.5 s; the shipped unit's TimeoutStopSec=20 allows "
            "at most 12.5 s: raise TimeoutStopSec in a drop-in (to 20.5 at least)",
            4,
        )
    ]
    assert list(report.findings) == (expected if warned else [])
    assert report.ok


def test_the_stop_timeout_checked_is_the_units() -> None:
    unit = (Path(__file__).parents[2] / "systemd" / "runtime-proxy.service").read_text()
    assert f"\nTimeoutStopSec={checkconfig.UNIT_TIMEOUT_STOP_S:g}\n" in unit


async def test_a_hook_server_listened_on_by_an_untrusted_user_is_named(
    tmp_path: Path, live: Path, hook_dir: Path
) -> None:
    """check-config names the user listening on a hook server's socket when the
    proxy would refuse it (untrusted_endpoint): the documented case, a socket
    chowned to root that nobody listens on, the hook file root's. Before:
    the file was valid, nothing said who listened; then "not root or the hook
    file's owner (uid 0)", the owner said twice."""
    if os.geteuid() != 0:
        fail_or_skip("needs root to run a server as another user (CI runs as root)")
    with dir_for_nobody() as directory:
        endpoint = directory / "hook.sock"
        async with served_by_nobody(endpoint) as server:
            os.chown(endpoint, 0, 0)
            path = hook_file(hook_dir, "a.json", valid_hook(endpoint))
            report = await asyncio.to_thread(check, good_config(tmp_path, live, hook_dir))
    (finding,) = report.findings
    assert (finding.severity, finding.subject) == (Severity.WARNING, path)
    assert finding.reason.startswith(
        f"remote-endpoint: listened on by uid {NOBODY} (pid {server.process.pid}), not root: the proxy refuses "
        "its calls as untrusted_endpoint")


async def test_a_hook_server_socket_the_proxy_would_refuse_is_named(
    tmp_path: Path, live: Path, hook_dir: Path
) -> None:
    """The socket owned by nobody (the listener's), the hook file root's: the
    proxy refuses it on both data paths for its owner, and check-config says
    so, next to who listens (before: the listener alone, on the frames data
    path's rule)."""
    if os.geteuid() != 0:
        fail_or_skip("needs root to run a server as another user (CI runs as root)")
    with dir_for_nobody() as directory:
        endpoint = directory / "hook.sock"
        async with served_by_nobody(endpoint):
            path = hook_file(hook_dir, "a.json", valid_hook(endpoint))
            report = await asyncio.to_thread(check, good_config(tmp_path, live, hook_dir))
    owned, listened = report.findings
    assert (owned.severity, owned.subject) == (Severity.WARNING, path)
    assert owned.reason == (
        f"remote-endpoint: untrusted endpoint: socket {endpoint} is owned by uid {NOBODY}, not root: the proxy "
        f"refuses its calls as untrusted_endpoint ({endpoint})")
    assert listened.reason.startswith(f"remote-endpoint: listened on by uid {NOBODY} ")


def test_a_live_hook_socket_is_connected_to_once(tmp_path: Path, live: Path, hook_dir: Path, sock_dir: Path) -> None:
    """check-config reads who listens from its probe's own connect (before:
    a second connect for SO_PEERCRED)."""
    endpoint = sock_dir / "hook.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(endpoint))
        listener.listen(8)
        hook_file(hook_dir, "a.json", valid_hook(endpoint))
        report = check(good_config(tmp_path, live, hook_dir))
        listener.setblocking(False)
        accepted = []
        with contextlib.suppress(BlockingIOError):
            while True:
                accepted.append(listener.accept()[0])
        for conn in accepted:
            conn.close()
    assert not report.findings
    assert len(accepted) == 1
