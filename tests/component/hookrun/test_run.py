"""``runtime-proxy hook run``: registration, the proxy calling the hook,
shutdown order, start-up errors; ``hook list``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from hooks.builtin import BuiltinUnavailable, load_builtin
from hooks.sdk import write_hook_config
from runtimeproxy.app import RunningProxy
from runtimeproxy.hookpath.points import HookType

from ...hookprocs import registered
from ...unixsockets import stale_lock_holder
from ..fakes import FakeBackend
from .conftest import CREATE, REPO, StartHook, create_request

ALL_HOOKS = [h.value for h in HookType]


def hook_calls(running: RunningProxy, server: str, hook: str, outcome: str = "ok") -> float:
    labels = {"server": server, "hook": hook, "outcome": outcome}
    return running.metrics.registry.get_sample_value("runtime_proxy_hook_calls_total", labels) or 0.0


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_noop_is_registered_called_and_deregistered_before_it_stops(
    running: RunningProxy, fake: FakeBackend, client: aio.Channel, sock_dir: Path, hook_dir: Path, hook_run: StartHook,
    transport: str,
) -> None:
    sock = sock_dir / "noop.sock"
    run = await hook_run(
        "noop", "--socket", str(sock), "--hook-dir", str(hook_dir), "--failure-policy", "Fail",
        "--timeout", "1s", "--priority", "7", "--drain", "2", "--log-format", "json", "--log-level", "debug",
        "--transport", transport,
    )
    listening = json.loads(await run.wait_for('"msg": "hook server listening on'))
    assert listening["transport"] == transport
    registered_line = json.loads(await run.wait_for('"msg": "hook registered"'))
    assert registered_line["hook"] == "noop" and registered_line["hook_file"] == str(hook_dir / "noop.json")

    registration = hook_dir / "noop.json"
    assert stat.S_IMODE(registration.stat().st_mode) == 0o644
    assert json.loads(registration.read_text()) == {
        "remote-endpoint": str(sock),
        "failure-policy": "Fail",
        "runtime-hooks": ALL_HOOKS,
        "timeout": "1s",
        "priority": 7,
    }

    await registered(running, 1)
    await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    assert hook_calls(running, "noop.json", "PreCreateContainer") == 1
    assert v1.CreateContainerRequest.FromString(fake.calls(CREATE)[0].requests[0]) == create_request()
    logged = json.loads(await run.wait_for('"msg": "PreCreateContainer hook call answered in'))
    assert (logged["hook"], logged["pod"], logged["container"]) == ("PreCreateContainer", "default/web", "app")

    run.process.send_signal(signal.SIGTERM)
    await run.wait_for('"msg": "registration removed"')
    # The registration is gone while the server still serves (--drain): the proxy stops calling first.
    assert not registration.exists()
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    code, rest = await run.finish()
    assert code == 0, rest
    assert '"msg": "stopped"' in rest
    assert not sock.exists()
    assert list(hook_dir.iterdir()) == []
    await registered(running, 0)


async def test_stale_registration_and_socket_are_replaced(sock_dir: Path, hook_dir: Path, hook_run: StartHook) -> None:
    sock = sock_dir / "noop.sock"
    stale = write_hook_config(hook_dir, "noop", sock_dir / "crashed.sock", ["PreStartContainer"], "Fail", "9s")
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(sock))  # bound, never listening: what a crash leaves behind
    leftover.close()

    run = await hook_run("noop", "--socket", str(sock), "--hook-dir", str(hook_dir), "--drain", "0")
    await run.wait_for("hook registered")
    assert json.loads(stale.read_text()) == {"remote-endpoint": str(sock), "failure-policy": "Ignore", "runtime-hooks": ALL_HOOKS}
    assert stat.S_IMODE(stale.stat().st_mode) == 0o644
    assert [p.name for p in hook_dir.iterdir()] == ["noop.json"]  # no temporary file left

    run.process.send_signal(signal.SIGTERM)
    code, rest = await run.finish()
    assert code == 0, rest
    assert not stale.exists() and not sock.exists()


async def test_background_failure_exits_non_zero_after_deregistering(
    sock_dir: Path, hook_dir: Path, hook_run: StartHook
) -> None:
    sock = sock_dir / "failing.sock"
    run = await hook_run("failing", "--socket", str(sock), "--hook-dir", str(hook_dir), "--log-format", "json")
    await run.wait_for('"msg": "hook registered"')
    failed = json.loads(await run.wait_for('"msg": "background work failed; shutting down"'))
    assert "reconcile loop lost its source" in failed["error"]
    assert "RuntimeError" in failed["exception"]
    code, rest = await run.finish()
    assert code == 1, rest
    assert '"msg": "registration removed"' in rest
    assert list(hook_dir.iterdir()) == []
    assert not sock.exists()


async def test_sigterm_cancels_background_after_deregistering_and_stopping(
    sock_dir: Path, hook_dir: Path, hook_run: StartHook
) -> None:
    record = sock_dir / "seen.json"
    config = sock_dir / "watchful.yaml"
    config.write_text(f"record: {record}\nregistration: {hook_dir / 'watchful.json'}\n")
    run = await hook_run(
        "watchful", "--socket", str(sock_dir / "w.sock"), "--hook-dir", str(hook_dir), "--config", str(config), "--drain", "0"
    )
    await run.wait_for("hook registered")
    doc = json.loads((hook_dir / "watchful.json").read_text())
    assert doc["runtime-hooks"] == ["PreStartContainer", "PostStopContainer"]  # the hook's HOOKS
    run.process.send_signal(signal.SIGTERM)
    code, rest = await run.finish()
    assert code == 0, rest
    assert json.loads(record.read_text()) == {"registration": False, "socket": False}
    # the signal in one line (before, two: `stop signal received`, then hook run's own)
    (signalled,) = [line for line in rest.splitlines() if "signal received" in line]
    assert "'signal received, shutting down' signal=SIGTERM" in signalled


async def test_a_registration_left_in_place_still_stops_the_server_and_background_and_exits_1(
    sock_dir: Path, hook_dir: Path, hook_run: StartHook
) -> None:
    """The hook directory gone read-only: the error names the file, the stop
    goes on in its order, and the exit is 1 (systemd shows the unit failed).
    Before: the OSError escaped the stop's finally ('fatal', a traceback), the
    server's stop and the background work's cancel were skipped; then, once
    caught, the exit was 0 with the file left for the proxy to call."""
    record = sock_dir / "seen.json"
    config = sock_dir / "stuck.yaml"
    registration = hook_dir / "stuck.json"
    config.write_text(f"record: {record}\nregistration: {registration}\n")
    sock = sock_dir / "s.sock"
    run = await hook_run(
        "stuck", "--socket", str(sock), "--hook-dir", str(hook_dir), "--config", str(config), "--drain", "0",
        "--log-format", "json",
    )
    await run.wait_for('"msg": "hook registered"')
    run.process.send_signal(signal.SIGTERM)
    code, rest = await run.finish()
    # The background work was cancelled after the server's stop (its socket gone), the file still there.
    assert record.exists() and json.loads(record.read_text()) == {"registration": True, "socket": False}, rest
    assert registration.exists() and not sock.exists()
    lines = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    assert not [line for line in lines if line["msg"] == "fatal"], rest
    assert [line["msg"] for line in lines][-1] == "stopped"
    [error] = [line for line in lines if line["msg"].startswith("cannot remove the registration")]
    assert error["hook_file"] == str(registration) and "Read-only file system" in error["error"]
    assert code == 1, rest


async def test_ready_and_stopping_are_told_to_systemd(sock_dir: Path, hook_dir: Path, hook_run: StartHook) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(sock_dir / "notify.sock"))
    notify.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        run = await hook_run(
            "noop", "--socket", str(sock_dir / "n.sock"), "--hook-dir", str(hook_dir), "--drain", "0",
            env={**os.environ, "NOTIFY_SOCKET": str(sock_dir / "notify.sock")},
        )
        assert await asyncio.wait_for(loop.sock_recv(notify, 64), 20) == b"READY=1"
        assert (hook_dir / "noop.json").exists()  # ready means registered
        run.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(loop.sock_recv(notify, 64), 20) == b"STOPPING=1"
        code, rest = await run.finish()
        assert code == 0, rest
    finally:
        notify.close()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_stop_signal_while_waiting_for_the_sockets_lock_ends_it_at_once_unregistered(
    sock_dir: Path, hook_dir: Path, hook_run: StartHook, transport: str
) -> None:
    # The socket's lock held by an instance that does not serve it: this one
    # waits (up to 30 s, more than the unit's TimeoutStopSec): a signal ends the wait.
    sock = sock_dir / "held.sock"
    async with stale_lock_holder(sock):
        run = await hook_run("noop", "--socket", str(sock), "--hook-dir", str(hook_dir), "--log-format", "json",
                             "--transport", transport)
        await run.wait_for('"msg": "socket path held by another instance')
        run.process.send_signal(signal.SIGTERM)
        code, rest = await run.finish()
    assert code == 0, rest
    assert rest.count('"msg": "signal received, shutting down"') == 1 and "neither served it" not in rest
    assert list(hook_dir.iterdir()) == []


async def test_socket_in_use_exits_1_without_registering(sock_dir: Path, hook_dir: Path, hook_run: StartHook) -> None:
    sock = sock_dir / "busy.sock"
    first = await hook_run("noop", "--socket", str(sock), "--hook-dir", str(sock_dir / "other.d"))
    await first.wait_for("hook registered")
    second = await hook_run("noop", "--socket", str(sock), "--hook-dir", str(hook_dir))
    code, rest = await second.finish()
    assert code == 1, rest
    assert "cannot serve" in rest and "in use" in rest
    assert list(hook_dir.iterdir()) == []
    assert stat.S_ISSOCK(sock.lstat().st_mode)  # the first one's socket is left alone


@pytest.mark.parametrize("socket_at", ["file/h.sock", "file"], ids=["below a regular file", "a regular file"])
async def test_a_socket_path_nothing_can_listen_at_exits_2_in_one_line(
    socket_at: str, sock_dir: Path, hook_dir: Path, hook_run: StartHook
) -> None:
    """Exit 2: the unit's RestartPreventExitStatus, or it would restart forever."""
    (sock_dir / "file").write_text("precious")
    run = await hook_run("noop", "--socket", str(sock_dir / socket_at), "--hook-dir", str(hook_dir), "--log-format", "json")
    code, err = await run.finish()
    assert code == 2, err
    (error,) = [line for line in err.splitlines() if not line.startswith("{")]  # the rest are log lines
    file = sock_dir / "file"
    reason = {
        "file/h.sock": f"cannot create the directory of {file / 'h.sock'}: {file} is not a directory",
        "file": f"{file} exists and is not a unix socket; refusing to replace it",
    }[socket_at]
    assert error == f"Error: hook noop: {reason}"
    assert "Traceback" not in err
    assert list(hook_dir.iterdir()) == [] and (sock_dir / "file").read_text() == "precious"


SETUP_ERRORS = {
    "unknown name": (["nosuch"], None, "no built-in hook named 'nosuch' (built-in hooks: balloons, batchresource, failing, noop, stuck, watchful)"),
    "config keys noop does not take": (["noop"], "cpu: 2\n", "hook noop: config {config}: this hook takes no settings, got cpu"),
    "config not YAML": (["noop"], "cpu: [2\n", "cannot read hook config"),
    "config nested too deeply": (["noop"], "a: " + "[" * 3000 + "]" * 3000 + "\n", "YAML nested too deeply"),
    "config not a mapping": (["noop"], "- 1\n", "expected a mapping of settings at the top level, got list"),
    "hook refuses config": (["watchful"], "record: /x\n", "hook watchful: config {config}: missing keys ['registration']"),
    "hook refuses no config": (["watchful"], None, "hook watchful: config (no --config given): missing keys ['record', 'registration']"),
    "config key twice": (
        ["noop"], "a:\n  b: 1\n  b: 2\n",
        "hook config {config}: 'a.b' is set twice (lines 2 and 3), to different values (YAML keeps the last); keep one",
    ),
    "bad timeout": (["noop", "--timeout", "5"], None, "invalid duration '5'"),
    "timeout over the limit": (["noop", "--timeout", "3m"], None, "at most 120s"),
}


@pytest.mark.parametrize("case", SETUP_ERRORS, ids=list(SETUP_ERRORS))
async def test_setup_errors_exit_2_with_a_clear_message(case: str, sock_dir: Path, hook_dir: Path, hook_run: StartHook) -> None:
    args, config, message = SETUP_ERRORS[case]
    sock = sock_dir / "h.sock"
    extra = ["--socket", str(sock), "--hook-dir", str(hook_dir)]
    if config is not None:
        (sock_dir / "hook.yaml").write_text(config)
        extra += ["--config", str(sock_dir / "hook.yaml")]
    code, err = await (await hook_run(*args, *extra)).finish()
    assert code == 2, err
    assert message.format(config=sock_dir / "hook.yaml") in err  # a bad config names its file
    assert list(hook_dir.iterdir()) == [] and not sock.exists()


async def test_missing_config_file_exits_2(sock_dir: Path, hook_dir: Path, hook_run: StartHook) -> None:
    missing = sock_dir / "absent.yaml"
    run = await hook_run("noop", "--socket", str(sock_dir / "h.sock"), "--hook-dir", str(hook_dir), "--config", str(missing))
    code, err = await run.finish()
    assert code == 2, err
    assert f"cannot read hook config {missing}" in err and "No such file" in err


def test_hook_list_names_each_builtin_with_its_hook_points() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runtimeproxy.cli", "hook", "list"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert (
        "noop\tanswers every hook point with no change (smoke-tests the hook path)\n"
        f"\thooks: {', '.join(ALL_HOOKS)}\n"
    ) in out
    # batchresource is listed whether or not it can be imported here.
    try:
        batch = load_builtin("batchresource")
    except BuiltinUnavailable:
        assert "batchresource\tunavailable: built-in hook 'batchresource' cannot be loaded" in out
    else:
        hooks = ", ".join(h.value for h in batch.HOOKS)
        assert f"batchresource\t{batch.SUMMARY}\n\thooks: {hooks}\n" in out


async def test_socket_path_too_long_exits_2(sock_dir: Path, hook_dir: Path, hook_run: StartHook) -> None:
    long = sock_dir / ("x" * 120) / "h.sock"
    code, err = await (await hook_run("noop", "--socket", str(long), "--hook-dir", str(hook_dir))).finish()
    assert code == 2, err
    assert "hook noop: unix socket path too long" in err


async def test_unwritable_hook_dir_exits_1_and_stops_serving(sock_dir: Path, hook_run: StartHook) -> None:
    not_a_dir = sock_dir / "hooks.d"
    not_a_dir.write_text("")
    sock = sock_dir / "h.sock"
    run = await hook_run("noop", "--socket", str(sock), "--hook-dir", str(not_a_dir), "--log-format", "json")
    code, err = await run.finish()
    assert code == 1, err
    assert '"msg": "cannot register"' in err and "File exists" in err
    assert not sock.exists()


async def test_socket_path_with_a_comma_exits_2_before_binding(sock_dir: Path, hook_dir: Path, hook_run: StartHook) -> None:
    """Before: bound and served, then refused at registration."""
    sock = sock_dir / "h,k.sock"
    code, err = await (await hook_run("noop", "--socket", str(sock), "--hook-dir", str(hook_dir))).finish()
    assert code == 2, err
    assert f"hook noop: cannot serve hooks at {sock}: a comma in a unix socket path" in err
    assert "hook registered" not in err and not sock.exists()
