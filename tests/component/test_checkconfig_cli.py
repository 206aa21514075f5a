"""``runtime-proxy check-config`` as an operator runs it: a process, its
output and its exit code, for valid and broken configs and hook directories."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..configcases import BAD_METRICS_HOSTS, SERVE_CRASHERS
from ..prerequisites import fail_or_skip, foreign_address

REPO = Path(__file__).resolve().parents[2]


def check_config(*args: str | Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "runtimeproxy.cli", "check-config", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


@pytest.fixture
def node() -> Iterator[Path]:
    """A node's files under a short directory: a live backend socket, a live
    hook server socket, a safe hook directory and a config naming them."""
    root = Path(tempfile.mkdtemp(prefix="ccc", dir="/tmp"))
    root.chmod(0o755)
    listeners = []
    for name in ("containerd.sock", "hook.sock"):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(root / name))
        listener.listen()
        listeners.append(listener)
    hooks = root / "hookserver.d"
    hooks.mkdir()
    hooks.chmod(0o755)
    write_hook(root, "koordlet.json", {"remote-endpoint": str(root / "hook.sock"), "runtime-hooks": ["PreCreateContainer"]})
    (root / "config.yaml").write_text(
        f"listen: {root / 'proxy.sock'}\nbackend: {root / 'containerd.sock'}\nhook-dir: {hooks}\nlog-format: json\n"
    )
    try:
        yield root
    finally:
        for listener in listeners:
            listener.close()
        shutil.rmtree(root)


def write_hook(root: Path, name: str, doc: dict[str, object] | str, mode: int = 0o644) -> Path:
    path = root / "hookserver.d" / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    path.chmod(mode)
    return path


def test_valid_node_exits_0_and_lists_what_serve_would_load(node: Path) -> None:
    result = check_config("--config", node / "config.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"hook {node / 'hookserver.d' / 'koordlet.json'}: valid" in result.stdout
    assert "hooks=[PreCreateContainer]" in result.stdout
    assert result.stdout.rstrip().endswith("0 error(s), 0 warning(s)")
    assert result.stderr == ""  # the registry's own log lines are not repeated


def test_warnings_alone_exit_0(node: Path) -> None:
    write_hook(node, "later.json", {"remote-endpoint": str(node / "not-up-yet.sock"), "runtime-hooks": []})
    result = check_config("--config", node / "config.yaml")
    assert result.returncode == 0, result.stdout
    later = node / "hookserver.d" / "later.json"
    assert f"warning: {later}: registers no runtime hooks" in result.stdout
    assert f"warning: {later}: remote-endpoint: socket does not exist" in result.stdout
    assert "0 error(s), 2 warning(s)" in result.stdout


def test_a_hook_endpoint_it_may_not_connect_to_is_a_warning_saying_so(node: Path) -> None:
    """As root without capabilities (setpriv), on a socket of another uid, mode 0600: EACCES
    passed for a live socket, and the file was reported valid."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        fail_or_skip("needs root and setpriv, to connect without CAP_DAC_OVERRIDE (CI runs as root)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(node / "theirs.sock"))
        listener.listen()
        os.chown(node / "theirs.sock", 12345, 12345)
        (node / "theirs.sock").chmod(0o600)
        write_hook(node, "theirs.json", {"remote-endpoint": str(node / "theirs.sock"), "runtime-hooks": ["PreStartContainer"]})
        result = check_config("--config", node / "config.yaml", prefix=("setpriv", "--bounding-set=-all", "--inh-caps=-all"))
    assert result.returncode == 0, result.stdout + result.stderr
    theirs = node / "hookserver.d" / "theirs.json"
    assert (f"warning: {theirs}: remote-endpoint: cannot connect: no permission to connect: "
            "the socket may belong to a server of another user") in result.stdout
    assert "0 error(s), 1 warning(s)" in result.stdout


@pytest.mark.parametrize(
    ("name", "doc", "mode", "reason"),
    [
        ("json.json", '{\n  "remote-endpoint": "/run/x.sock",\n  "runtime-hooks": ["PreCreateContainer",]\n}', 0o644,
         "invalid JSON: Expecting value at line 3 column 42"),
        ("hook.json", {"remote-endpoint": "/run/x.sock", "runtime-hooks": ["PreDeleteEverything"]}, 0o644,
         "unknown runtime hook 'PreDeleteEverything'"),
        ("timeout.json", {"remote-endpoint": "/run/x.sock", "timeout": "forever"}, 0o644, 'bad "timeout"'),
        ("perm.json", {"remote-endpoint": "/run/x.sock"}, 0o666, "refused: file"),
    ],
)
def test_bad_hook_file_exits_1_naming_file_and_reason(
    node: Path, name: str, doc: dict[str, object] | str, mode: int, reason: str
) -> None:
    path = write_hook(node, name, doc, mode)
    result = check_config("--config", node / "config.yaml")
    assert result.returncode == 1, result.stdout
    (error,) = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {path}: ") and reason in error
    assert "koordlet.json: valid" in result.stdout  # the good file is still reported


def test_non_socket_endpoint_exits_1(node: Path) -> None:
    (node / "regular").write_text("")
    path = write_hook(node, "file.json", {"remote-endpoint": str(node / "regular"), "runtime-hooks": ["PreStartContainer"]})
    result = check_config("--config", node / "config.yaml")
    assert result.returncode == 1
    assert f"error: {path}: remote-endpoint: exists and is not a unix socket ({node / 'regular'})" in result.stdout


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("listen: /tmp/x.sock\nbackend: {unclosed\n", 3, "cannot read config file"),
        ("listen: /tmp/x.sock\nhook-dirs: /etc/hooks\n", 2, "unknown setting 'hook-dirs' (did you mean 'hook-dir'?) (line 2)"),
        ("serve-versions: v1beta1\n", 1, "serve-versions 'v1beta1'"),
    ],
)
def test_bad_config_exits_1_with_its_line(node: Path, text: str, line: int, reason: str) -> None:
    config = node / "bad.yaml"
    config.write_text(text)
    result = check_config("--config", config, "--hook-dir", node / "hookserver.d")
    assert result.returncode == 1, result.stdout
    (error,) = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {config}:{line}: ") and reason in error
    # The hook directory given on the command line is still checked.
    assert "koordlet.json: valid" in result.stdout


def serve(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtimeproxy.cli", "serve", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )


@pytest.mark.parametrize(("text", "reason"), SERVE_CRASHERS + BAD_METRICS_HOSTS)
def test_what_serve_cannot_run_with_fails_both_the_same_way(node: Path, text: str, reason: str) -> None:
    """Each of these once passed check-config (0 errors), then serve died
    with a traceback (or, for the grace period, would never stop in time;
    for a metrics host, failed only once half started)."""
    config = node / "bad.yaml"
    config.write_text(f"listen: {node / 'proxy.sock'}\n{text}")
    checked = check_config("--config", config, "--hook-dir", node / "hookserver.d")
    assert checked.returncode == 1, checked.stdout
    (error,) = [line for line in checked.stdout.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {config}:2: config file {config}: {reason}")
    served = serve("--config", config, "--hook-dir", node / "hookserver.d")
    assert served.returncode == 1, served.stderr
    # One line, the same message, nothing started.
    assert served.stderr == f"Error: {error.split(': ', 2)[2]}\n"
    assert not (node / "proxy.sock").exists()


def test_a_metrics_address_not_of_this_host_fails_both_at_once(node: Path) -> None:
    """check-config binds the address serve would (on port 0): its error is the
    one serve stops with, in one line, before it listens."""
    config = node / "bad.yaml"
    address = foreign_address()
    config.write_text(f'listen: {node / "proxy.sock"}\nmetrics-listen: "{address}:9464"\n')
    checked = check_config("--config", config, "--hook-dir", node / "hookserver.d")
    assert checked.returncode == 1, checked.stdout
    (error,) = [line for line in checked.stdout.splitlines() if line.startswith("error:")]
    cause = "Cannot assign requested address (EADDRNOTAVAIL)"
    assert error == f"error: {config}:2: metrics-listen '{address}:9464': cannot bind '{address}': {cause}"
    served = serve("--config", config, "--hook-dir", node / "hookserver.d", "--log-format", "json")
    assert served.returncode == 1, served.stderr
    (fatal,) = [line for line in map(json.loads, served.stderr.splitlines()) if line["msg"] == "fatal"]
    assert fatal["error"] == f"metrics-listen '{address}:9464': cannot serve there: {cause}"
    assert not (node / "proxy.sock").exists()


def test_hook_dir_flag_overrides_the_config(node: Path) -> None:
    other = node / "other.d"
    other.mkdir()
    (other / "bad.json").write_text("{")
    (other / "bad.json").chmod(0o644)
    result = check_config("--config", node / "config.yaml", "--hook-dir", other)
    assert result.returncode == 1
    assert f"error: {other / 'bad.json'}: invalid JSON" in result.stdout
    assert "koordlet.json" not in result.stdout


def test_help_is_listed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runtimeproxy.cli", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert "check-config" in result.stdout


def test_every_problem_is_named_in_one_run_and_exit_1(node: Path) -> None:
    """Each run named one problem (the config's first bad key, and the hook directory
    went unchecked): a node with four took four runs to fix."""
    (node / "regular").write_text("")
    config = node / "broken.yaml"
    config.write_text(
        f"listen: {node / 'proxy.sock'}\nlog-level: loud\nbackend: {node / 'regular'}\n"
        f"grace-perod: 5\nhook-dir: {node / 'hookserver.d'}\n"
    )
    hook = write_hook(node, "broken.json", {"remote-endpoint": str(node / "hook.sock"), "timeout": "soon",
                                            "failure-policy": "Always", "Runtime-Hooks": ["PreCreateContainer"]})
    result = check_config("--config", config)
    assert result.returncode == 1, result.stdout
    errors = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert [line.split(": ")[1] for line in errors] == [
        f"{config}:2", f"{config}:4", str(node / "regular"), str(hook), str(hook)]
    assert f"error: {hook}: unknown \"failure-policy\" 'Always' (allowed: 'Fail', 'Ignore')" in errors
    assert f"error: {hook}: bad \"timeout\": invalid duration 'soon'" in "\n".join(errors)
    assert (f'warning: {hook}: key "Runtime-Hooks" read as "runtime-hooks" (koord-runtime-proxy reads keys in any case)'
            in result.stdout)
    assert "koordlet.json: valid" in result.stdout  # the good file is still reported
    assert result.stdout.rstrip().endswith("5 error(s), 1 warning(s)")
