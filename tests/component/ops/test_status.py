"""Issue 12: `runtime-proxy status` asks the running proxy (admin service on its socket)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from hooks.sdk import write_hook_config
from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig

from ...hookprocs import hook_server, registered
from ...prerequisites import fail_or_skip
from ..fakes import FakeBackend

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
RUN_POD = "/runtime.v1.RuntimeService/RunPodSandbox"


async def status_command(*args: str, prefix: tuple[str, ...] = ()) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-m", "runtimeproxy", "status", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode or 0, out.decode(), err.decode()


async def test_status_json_with_hooks_registered(sock_dir: Path) -> None:
    hook_dir = sock_dir / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    listen = sock_dir / "proxy.sock"
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as fake:
        fake.script(CREATE, response=v1.CreateContainerResponse(container_id="c-1").SerializeToString())
        config = ProxyConfig(listen=listen, backend=fake.socket, hook_dir=hook_dir, serve_versions="v1,v1alpha2")
        quota = {"PreCreateContainer": {"container_annotations": {"hooked": "yes"}}}
        async with contextlib.AsyncExitStack() as stack, hook_server(sock_dir, "quota", quota) as hook:
            running = await build_proxy(config, stack)
            await running.proxy.wait_ready(10)
            hook.register(hook_dir, ["PreCreateContainer", "PostStartContainer"], "Fail", timeout="2s", priority=5)
            write_hook_config(hook_dir, "gone", sock_dir / "nobody.sock", ["PreRunPodSandbox"], "Ignore", "500ms")
            await registered(running, 2)
            async with aio.insecure_channel(f"unix://{listen}") as channel:
                for _ in range(3):
                    await channel.unary_unary(CREATE)(v1.CreateContainerRequest(pod_sandbox_id="p").SerializeToString())
                await channel.unary_unary(RUN_POD)(b"")
                before_error = time.time()
            code, out, err = await status_command("--listen", str(listen), "--json")
            text_code, text, _ = await status_command("--listen", str(listen))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["backend"]["connected"] is True
    assert (doc["backend"]["runtime_name"], doc["backend"]["versions"]) == ("fake", ["v1"])
    assert doc["served"] == {"v1": "native", "v1alpha2": "translated to v1"}
    assert doc["calls"]["served"] == 4  # the status call itself is not CRI
    assert doc["calls"]["in_flight"] == 0
    assert 0 < doc["uptime_s"] < 60
    servers = {s["name"]: s for s in doc["hook_servers"]}
    assert set(servers) == {"quota.json", "gone.json"}
    quota_doc = servers["quota.json"]
    assert quota_doc["hooks"] == ["PostStartContainer", "PreCreateContainer"]
    assert (quota_doc["failure_policy"], quota_doc["timeout_s"], quota_doc["priority"]) == ("Fail", 2.0, 5)
    assert quota_doc["calls"] == {"ok": 3} and quota_doc["last_error"] is None
    gone = servers["gone.json"]
    assert gone["calls"] == {"unavailable": 1}
    assert gone["last_error"]["outcome"] == "unavailable" and gone["last_error"]["hook"] == "PreRunPodSandbox"
    assert gone["last_error"]["at"] >= before_error - 5
    assert gone["last_error"]["cause"].startswith("UNAVAILABLE: ")  # why, as the proxy's log says it
    assert str(sock_dir / "nobody.sock") in gone["last_error"]["cause"]
    # no call of it succeeded since: the error is current, one failed call in a row
    assert (gone["last_error"]["current"], gone["last_error"]["failed_calls"], gone["last_error"]["recovered_at"]) == (
        True, 1, None)
    assert text_code == 0
    assert "serving: CRI v1 (native), v1alpha2 (translated to v1)" in text
    assert "last error: unavailable on PreRunPodSandbox" in text
    assert f"Z: {gone['last_error']['cause']}" in text
    assert "      now: still failing, 1 failed call in a row since " in text


async def test_status_without_a_proxy_says_none_runs_there(sock_dir: Path) -> None:
    """It printed grpc's UNAVAILABLE: failed to connect to all addresses... (No such file or directory)."""
    code, _, err = await status_command("--listen", str(sock_dir / "nothing.sock"), "--timeout", "1")
    assert code == 1
    assert f"no socket at {sock_dir / 'nothing.sock'}: no proxy is running there" in err
    assert "give --listen PATH" in err and "UNAVAILABLE" not in err


async def test_status_on_a_socket_nobody_listens_on_says_it_was_left_behind(sock_dir: Path) -> None:
    left = sock_dir / "left.sock"
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(left))  # bound, never listening: what a killed proxy leaves
        code, _, err = await status_command("--listen", str(left), "--timeout", "1")
    assert code == 1
    assert f"nothing listens on {left}: a socket left behind by a proxy that was killed" in err


async def test_status_on_a_regular_file_says_it_is_no_socket(sock_dir: Path) -> None:
    regular = sock_dir / "config.yaml"
    regular.write_text("listen: /run/p.sock\n")
    code, _, err = await status_command("--listen", str(regular), "--timeout", "1")
    assert code == 1
    assert f"{regular} is not a unix socket: give the proxy's --listen PATH" in err


async def test_status_on_a_socket_that_never_answers_says_so(sock_dir: Path) -> None:
    stuck = sock_dir / "stuck.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(stuck))
        listening.listen()  # connections wait in the backlog: never accepted, never answered
        code, _, err = await status_command("--listen", str(stuck), "--timeout", "1")
    assert code == 1
    assert f"the proxy at {stuck} did not answer within 1s (--timeout); is it stuck?" in err


async def test_status_without_permission_on_the_socket_says_so(sock_dir: Path) -> None:
    """As root without capabilities (setpriv), on a socket of another uid, mode 0600: connect gets EACCES."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        fail_or_skip("needs root and setpriv, to connect without CAP_DAC_OVERRIDE (CI runs as root)")
    foreign = sock_dir / "foreign.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(foreign))
        listening.listen()
        os.chown(foreign, 12345, 12345)
        os.chmod(foreign, 0o600)
        without_caps = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
        code, _, err = await status_command("--listen", str(foreign), "--timeout", "5", prefix=without_caps)
    assert code == 1
    assert f"no permission to connect to {foreign}: the proxy's socket is for root and its group" in err


async def test_status_on_a_path_too_long_for_a_socket_says_so(sock_dir: Path) -> None:
    """grpc printed `E... parse_address.cc` lines, then a generic UNAVAILABLE message."""
    long = sock_dir / ("x" * (110 - len(str(sock_dir)))) / "p.sock"
    code, _, err = await status_command("--listen", str(long), "--timeout", "1")
    assert code == 1
    assert f"unix socket path too long ({len(str(long))} > 107 bytes): {long}" in err
    assert "parse_address" not in err and "UNAVAILABLE" not in err


async def test_status_on_a_runtime_socket_says_it_is_not_the_proxy(fake: FakeBackend) -> None:
    """It printed UNIMPLEMENTED: unknown service runtimeproxy.admin.v1.Admin (containerd's socket given)."""
    code, _, err = await status_command("--listen", str(fake.socket), "--timeout", "5")
    assert code == 1
    assert f"{fake.socket} answers gRPC but has no runtime-proxy status service" in err


async def test_the_router_leaves_admin_calls_alone(fake: FakeBackend, start_proxy, sock_dir: Path) -> None:
    """Not a CRI path: the router passes it on (a bare Proxy has no admin service: UNIMPLEMENTED, no CRI refusal)."""
    await start_proxy(fake.socket)
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as channel:
        with pytest.raises(aio.AioRpcError) as err:
            await channel.unary_unary("/runtimeproxy.admin.v1.Admin/Status")(b"")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_status_names_the_hook_directory_and_its_rejected_files(sock_dir: Path) -> None:
    """A bad hook file showed nowhere in `status` ("hook servers: 0"): only in the log."""
    hook_dir = sock_dir / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    (hook_dir / "broken.json").write_text('{"remote-endpoint": "/run/x.sock",\n')
    listen = sock_dir / "proxy.sock"
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as fake:
        config = ProxyConfig(listen=listen, backend=fake.socket, hook_dir=hook_dir)
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            await running.proxy.wait_ready(10)
            code, out, err = await status_command("--listen", str(listen), "--json")
            _, text, _ = await status_command("--listen", str(listen))
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["hook_dir"], doc["hook_dir_problem"]) == (str(hook_dir), None)
    assert list(doc["hook_files_rejected"]) == ["broken.json"]
    assert doc["hook_files_rejected"]["broken.json"].startswith("invalid JSON: ")
    assert f"hook servers: 0, from {hook_dir}" in text
    assert "hook files rejected: 1" in text and "  broken.json: invalid JSON: " in text


async def test_status_says_when_the_hook_directory_is_missing(sock_dir: Path) -> None:
    listen = sock_dir / "proxy.sock"
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as fake:
        config = ProxyConfig(listen=listen, backend=fake.socket, hook_dir=sock_dir / "typo.d")
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            await running.proxy.wait_ready(10)
            code, text, err = await status_command("--listen", str(listen))
    assert code == 0, err
    assert f"hook servers: 0, from {sock_dir / 'typo.d'}" in text
    assert f"  hook directory: hook directory {sock_dir / 'typo.d'} does not exist" in text


async def test_status_finds_the_proxy_by_the_config_serve_was_started_with(sock_dir: Path) -> None:
    """status had no --config: an operator repeated the config's listen as --listen, or asked the default socket."""
    listen = sock_dir / "elsewhere.sock"
    config_file = sock_dir / "config.yaml"
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as fake:
        config_file.write_text(f"listen: unix://{listen}\nbackend: {fake.socket}\nhook-dir: {sock_dir / 'hooks.d'}\n")
        config = ProxyConfig(listen=listen, backend=fake.socket, hook_dir=sock_dir / "hooks.d")
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            await running.proxy.wait_ready(10)
            code, text, err = await status_command("--config", str(config_file))
            flag_code, _, flag_err = await status_command(
                "--config", str(config_file), "--listen", str(sock_dir / "other.sock"), "--timeout", "1")
    assert code == 0, err
    assert f"listening on {listen}" in text and f"hook servers: 0, from {sock_dir / 'hooks.d'}" in text
    assert flag_code == 1  # the flag wins over the file
    assert f"no socket at {sock_dir / 'other.sock'}" in flag_err
    assert "give --listen PATH, or --config FILE as serve was started with" in flag_err
