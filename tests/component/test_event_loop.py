"""`runtime-proxy serve` and `hook run` on uvloop: every grpc.aio part of the
proxy (server, backend channel, hook dispatch, health) and of the hook SDK
server runs there, on both data paths, and SIGTERM stops them in order."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.host.process import terminate_process

from .fakes import FakeBackend
from .test_process import wait_for_line

VERSION = "/runtime.v1.RuntimeService/Version"
LIST = "/runtime.v1.ImageService/ListImages"  # no start-up rebuild reads it
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
CLI = (sys.executable, "-m", "runtimeproxy.cli")


def big_list() -> v1.ListImagesResponse:
    """About 4 MiB: many DATA frames and WINDOW_UPDATEs on each hop."""
    return v1.ListImagesResponse(images=[v1.Image(id=f"img-{i}", repo_tags=["x" * 2048]) for i in range(2000)])


def create_request() -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name="app")),
        sandbox_config=v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="web", uid="uid-1", namespace="default")),
    )


def fields(line: str) -> dict[str, object]:
    return json.loads(line)


async def stop(process: asyncio.subprocess.Process) -> tuple[int, str]:
    """SIGTERM; the exit code and the rest of the log."""
    assert process.stderr is not None
    process.send_signal(signal.SIGTERM)
    rest = (await asyncio.wait_for(process.stderr.read(), 30)).decode()
    return await asyncio.wait_for(process.wait(), 30), rest


@pytest.mark.parametrize("data_path", ["grpc", "frames"])
async def test_serve_and_hook_run_on_uvloop_answer_calls_and_stop_on_sigterm(
    data_path: str, fake: FakeBackend, sock_dir: Path
) -> None:
    listen, hook_dir, hook_sock = sock_dir / "proxy.sock", sock_dir / "hooks.d", sock_dir / "noop.sock"
    listing = big_list()
    fake.script(LIST, response=listing.SerializeToString())
    fake.script(CREATE, response=v1.CreateContainerResponse(container_id="ctr-1").SerializeToString())
    hook = await asyncio.create_subprocess_exec(
        *CLI, "hook", "run", "noop", "--socket", str(hook_sock), "--hook-dir", str(hook_dir), "--drain", "0",
        "--event-loop", "uvloop", "--log-format", "json", "--log-level", "debug", stderr=asyncio.subprocess.PIPE,
    )
    proxy: asyncio.subprocess.Process | None = None
    try:
        assert hook.stderr is not None
        registered = await wait_for_line(hook.stderr, '"msg": "hook registered"')
        assert fields(registered[-1])["event_loop"] == "uvloop"
        # Started after the registration: the proxy's first read of the hook directory has it.
        proxy = await asyncio.create_subprocess_exec(
            *CLI, "serve", "--listen", str(listen), "--backend", str(fake.socket), "--hook-dir", str(hook_dir),
            "--data-path", data_path, "--event-loop", "uvloop", "--log-format", "json",
            stderr=asyncio.subprocess.PIPE,
        )
        assert proxy.stderr is not None
        lines = await wait_for_line(proxy.stderr, "serving v1 (native)")
        loop_line = next(fields(line) for line in lines if '"msg": "event loop running"' in line)
        assert (loop_line["event_loop"], loop_line["setting"]) == ("uvloop", "uvloop")

        async with aio.insecure_channel(f"unix://{listen}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            answers = await asyncio.gather(*(channel.unary_unary(VERSION)(b"", timeout=10) for _ in range(20)))
            assert {v1.VersionResponse.FromString(a).runtime_name for a in answers} == {"fake"}
            lists = await asyncio.gather(*(channel.unary_unary(LIST)(b"", timeout=30) for _ in range(4)))
            assert all(v1.ListImagesResponse.FromString(a) == listing for a in lists)
            created = await channel.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
            assert v1.CreateContainerResponse.FromString(created).container_id == "ctr-1"
        # The hook server answered the proxy's pre hook, then the runtime got the call.
        answered = await wait_for_line(hook.stderr, '"msg": "PreCreateContainer hook call answered in')
        assert fields(answered[-1])["hook"] == "PreCreateContainer"
        assert len(fake.calls(CREATE)) == 1

        code, rest = await stop(proxy)
        assert code == 0, rest
        assert '"msg": "stopped"' in rest
        assert not listen.exists()
        code, rest = await stop(hook)
        assert code == 0, rest
        assert '"msg": "registration removed"' in rest
        assert not (hook_dir / "noop.json").exists()
    finally:
        for process, name in ((proxy, "proxy"), (hook, "hook run")):
            if process is not None:
                await terminate_process(process, 10, name)


async def test_serve_refuses_uvloop_when_it_cannot_be_imported(sock_dir: Path) -> None:
    # A Python whose uvloop import fails (a None entry in sys.modules makes
    # `import uvloop` raise ImportError), as on a build without it.
    script = "import sys; sys.modules['uvloop'] = None\nfrom runtimeproxy.cli import main\nmain()"
    listen = sock_dir / "proxy.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, "serve", "--listen", str(listen), "--backend", str(sock_dir / "none.sock"),
        "--event-loop", "uvloop", stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    assert "event loop 'uvloop': uvloop is not installed" in err.decode()
    assert not listen.exists()
