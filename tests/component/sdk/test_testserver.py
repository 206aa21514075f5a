"""The test hook server (``python -m hooks.testserver``) as a real process on a
real unix socket; readiness is awaited from its "ready" line, never slept for.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from cri_api.hookapi import api_pb2, api_pb2_grpc
from hooks.testserver import ConfigError, load_config
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType
from tests.filewatch import until_on_disk
from tests.hookrequests import container_request, pod_request, request_for

PROJECT_ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT = 15.0


class RunningServer:
    """A running `python -m hooks.testserver` subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process, socket_path: Path, record: Path, stderr: Path) -> None:
        self.proc = proc
        self.socket_path = socket_path
        self.record = record
        self.stderr = stderr
        self.channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        self.stub = api_pb2_grpc.RuntimeHookServiceStub(self.channel)

    def call(self, hook: HookType, request=None, timeout: float = 5.0):  # type: ignore[no-untyped-def]
        method = getattr(self.stub, HOOK_POINTS[hook].rpc_name)
        return method(request if request is not None else request_for(hook), timeout=timeout)

    def records(self) -> list[dict]:
        if not self.record.exists():
            return []
        complete = self.record.read_text().split("\n")[:-1]  # a line still being written is not a record yet
        return [json.loads(line) for line in complete]

    async def wait_records(self, count: int, timeout: float = 10.0) -> list[dict]:
        """The records once at least `count` requests have reached the server (file events, no polling)."""
        await until_on_disk(self.record.parent, lambda: len(self.records()) >= count, f"{count} record(s)", timeout)
        return self.records()

    async def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def close(self) -> None:
        await self.channel.close()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def spawn(sock_dir: Path, *args: str) -> tuple[asyncio.subprocess.Process, Path]:
    stderr = sock_dir / "stderr.log"
    with open(stderr, "ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hooks.testserver", *args,
            stdout=asyncio.subprocess.PIPE, stderr=err, cwd=PROJECT_ROOT,
        )  # fmt: skip
    return proc, stderr


async def start_testserver(sock_dir: Path, config: object, *extra: str) -> RunningServer:
    socket_path = sock_dir / "hook.sock"
    record = sock_dir / "record.jsonl"
    cfg = config if isinstance(config, str) else json.dumps(config)
    proc, stderr = await spawn(sock_dir, "--socket", str(socket_path), "--config", cfg, "--record", str(record), *extra)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
    if line != b"ready\n":
        await proc.wait()
        pytest.fail(f"testserver did not become ready (rc={proc.returncode}): {stderr.read_text()}")
    return RunningServer(proc, socket_path, record, stderr)


@pytest.fixture
async def servers(sock_dir: Path) -> AsyncIterator[list[RunningServer]]:
    started: list[RunningServer] = []
    yield started
    for server in started:
        await server.close()


FULL_CONFIG = {
    "PreRunPodSandbox": {
        "labels": {"hooked": "pod"},
        "annotations": {"pod-anno": "x"},
        "cgroup_parent": "/kubepods/burstable/poduid-1",
        "resources": {"cpu_shares": 2, "memory_limit_in_bytes": 1073741824},
    },
    "PostStopPodSandboxHook": {"annotations": {"stopped": "yes"}},  # RPC name accepted too
    "PreCreateContainer": {
        "container_resources": {
            "cpu_period": 100000,
            "cpu_quota": 50000,
            "cpu_shares": 512,
            "memory_limit_in_bytes": 268435456,
            "cpuset_cpus": "0-1",
            "unified": {"memory.high": "200M"},
        },
        "container_annotations": {"hooked": "create"},
        "container_envs": {"HOOKED": "1"},
        "pod_cgroup_parent": "/kubepods/x",
    },
    "PreStartContainer": {"container_annotations": {"hooked": "start"}},
    "PostStartContainer": {"container_envs": {"POST": "start"}},
    "PostStopContainer": {"container_annotations": {"hooked": "stop"}},
    "PreUpdateContainerResources": {"container_resources": {"cpuset_cpus": "2-3", "cpu_quota": -1}},
}


@pytest.mark.parametrize("loop", ["auto", "asyncio"])  # auto: uvloop, the SDK's run
async def test_testserver_answers_every_hook_and_records_requests(
    sock_dir: Path, servers: list[RunningServer], loop: str
) -> None:
    server = await start_testserver(sock_dir, FULL_CONFIG, "--event-loop", loop)
    servers.append(server)
    assert stat.S_IMODE(os.stat(server.socket_path).st_mode) == 0o660

    expected = {
        HookType.PRE_RUN_POD_SANDBOX: api_pb2.PodSandboxHookResponse(
            labels={"hooked": "pod"},
            annotations={"pod-anno": "x"},
            cgroup_parent="/kubepods/burstable/poduid-1",
            resources=api_pb2.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=1 << 30),
        ),
        HookType.POST_STOP_POD_SANDBOX: api_pb2.PodSandboxHookResponse(annotations={"stopped": "yes"}),
        HookType.PRE_CREATE_CONTAINER: api_pb2.ContainerResourceHookResponse(
            container_resources=api_pb2.LinuxContainerResources(
                cpu_period=100000,
                cpu_quota=50000,
                cpu_shares=512,
                memory_limit_in_bytes=256 << 20,
                cpuset_cpus="0-1",
                unified={"memory.high": "200M"},
            ),
            container_annotations={"hooked": "create"},
            container_envs={"HOOKED": "1"},
            pod_cgroup_parent="/kubepods/x",
        ),
        HookType.PRE_START_CONTAINER: api_pb2.ContainerResourceHookResponse(container_annotations={"hooked": "start"}),
        HookType.POST_START_CONTAINER: api_pb2.ContainerResourceHookResponse(container_envs={"POST": "start"}),
        HookType.POST_STOP_CONTAINER: api_pb2.ContainerResourceHookResponse(container_annotations={"hooked": "stop"}),
        HookType.PRE_UPDATE_CONTAINER_RESOURCES: api_pb2.ContainerResourceHookResponse(
            container_resources=api_pb2.LinuxContainerResources(cpuset_cpus="2-3", cpu_quota=-1)
        ),
    }
    for hook in HookType:
        assert await server.call(hook) == expected[hook], hook

    records = server.records()
    assert [r["hook"] for r in records] == [h.value for h in HookType]
    assert [r["rpc"] for r in records] == [HOOK_POINTS[h].rpc_name for h in HookType]
    by_hook = {r["hook"]: r["request"] for r in records}
    # Requests are recorded as MessageToDict(preserving_proto_field_name=True): int64 as strings.
    assert by_hook["PreRunPodSandbox"] == json_format.MessageToDict(pod_request(), preserving_proto_field_name=True)
    assert by_hook["PreRunPodSandbox"]["pod_meta"] == {"name": "nginx", "uid": "uid-1", "namespace": "default", "attempt": 1}
    create = by_hook["PreCreateContainer"]
    assert create["container_meta"] == {"name": "web", "id": "cid-1"}
    assert create["container_resources"] == {"cpu_shares": "1024", "memory_limit_in_bytes": str(1 << 30)}
    assert create["container_envs"] == {"PATH": "/bin"}

    assert await server.terminate() == 0


async def test_unconfigured_hooks_answer_empty_response(sock_dir: Path, servers: list[RunningServer]) -> None:
    server = await start_testserver(sock_dir, {})
    servers.append(server)
    for hook in HookType:
        response = await server.call(hook)
        assert response == HOOK_POINTS[hook].response_type()
        assert response.ByteSize() == 0
    assert len(server.records()) == len(HookType)
    assert await server.terminate() == 0


async def test_error_behaviour(sock_dir: Path, servers: list[RunningServer]) -> None:
    config = {
        "PreCreateContainer": {"behaviour": "error", "message": "quota exceeded"},
        "PreStartContainer": {"behavior": "error", "code": "FAILED_PRECONDITION", "message": "not now"},
        "PostStartContainer": {"container_envs": {"OK": "1"}},
    }
    server = await start_testserver(sock_dir, config)
    servers.append(server)

    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
        await server.call(HookType.PRE_CREATE_CONTAINER)
    assert excinfo.value.code() == grpc.StatusCode.INTERNAL
    assert excinfo.value.details() == "quota exceeded"

    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
        await server.call(HookType.PRE_START_CONTAINER)
    assert excinfo.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert excinfo.value.details() == "not now"

    # Still serving afterwards.
    assert (await server.call(HookType.POST_START_CONTAINER)).container_envs == {"OK": "1"}
    assert [r["hook"] for r in server.records()] == ["PreCreateContainer", "PreStartContainer", "PostStartContainer"]
    assert await server.terminate() == 0


async def test_hang_behaviour_and_sigterm_with_call_in_flight(sock_dir: Path, servers: list[RunningServer]) -> None:
    server = await start_testserver(sock_dir, {"PostStartContainer": "hang", "PreStartContainer": {"delay": 0.05}})
    servers.append(server)

    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
        await server.call(HookType.POST_START_CONTAINER, timeout=0.3)
    assert excinfo.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert server.records()[0]["hook"] == "PostStartContainer"

    # A hanging call does not block the others.
    hanging = asyncio.ensure_future(server.call(HookType.POST_START_CONTAINER, timeout=30))
    await server.wait_records(2)  # the second hanging call is in flight at the server
    assert await server.call(HookType.PRE_START_CONTAINER) == api_pb2.ContainerResourceHookResponse()
    assert [r["hook"] for r in server.records()][-2:] == ["PostStartContainer", "PreStartContainer"]

    # SIGTERM with the hanging call in flight: clean exit, the client sees the call end.
    assert await server.terminate() == 0
    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
        await asyncio.wait_for(hanging, 10)
    assert excinfo.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert not server.socket_path.exists()


async def test_crash_behaviour(sock_dir: Path, servers: list[RunningServer]) -> None:
    server = await start_testserver(sock_dir, {"PostStopContainer": {"behaviour": "crash"}})
    servers.append(server)
    assert await server.call(HookType.PRE_CREATE_CONTAINER) == api_pb2.ContainerResourceHookResponse()

    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
        await server.call(HookType.POST_STOP_CONTAINER, request=container_request(pod_cgroup_parent="/crash"))
    assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await asyncio.wait_for(server.proc.wait(), 10) == 1
    # The request was recorded (and flushed) before the process died.
    last = server.records()[-1]
    assert last["hook"] == "PostStopContainer" and last["request"]["pod_cgroup_parent"] == "/crash"


async def test_sigterm_exits_cleanly_and_removes_socket(sock_dir: Path, servers: list[RunningServer]) -> None:
    server = await start_testserver(sock_dir, {})
    servers.append(server)
    assert server.socket_path.exists()
    assert await server.terminate() == 0
    assert not server.socket_path.exists()
    assert "Traceback" not in server.stderr.read_text()


async def test_config_from_file_and_delay(sock_dir: Path, servers: list[RunningServer]) -> None:
    config_file = sock_dir / "config.json"
    config_file.write_text(json.dumps({"PreCreateContainer": {"delay": 0.2, "container_envs": {"SLOW": "1"}}}))
    server = await start_testserver(sock_dir, str(config_file))
    servers.append(server)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert (await server.call(HookType.PRE_CREATE_CONTAINER)).container_envs == {"SLOW": "1"}
    assert loop.time() - start >= 0.2
    with pytest.raises(grpc.aio.AioRpcError) as excinfo:
        await server.call(HookType.PRE_CREATE_CONTAINER, timeout=0.05)
    assert excinfo.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await server.terminate() == 0


async def test_stale_socket_is_replaced(sock_dir: Path, servers: list[RunningServer]) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_dir / "hook.sock"))
    stale.close()  # leaves the socket file behind, nobody listening
    server = await start_testserver(sock_dir, {})
    servers.append(server)
    assert await server.call(HookType.PRE_START_CONTAINER) == api_pb2.ContainerResourceHookResponse()
    assert await server.terminate() == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"PreCreateContainer": ', "invalid JSON"),
        ({"PreRemoveRunPodSandbox": {}}, "unknown hook 'PreRemoveRunPodSandbox'"),
        ({"PreCreateContainer": {"behaviour": "explode"}}, "unknown behaviour 'explode'"),
        ({"PreCreateContainer": {"container_resources": {"cpu_sharez": 1}}}, "bad ContainerResourceHookResponse fields"),
        ({"PreRunPodSandbox": {"container_envs": {"A": "1"}}}, "bad PodSandboxHookResponse fields"),
        ({"PreCreateContainer": {"behaviour": "error", "code": "NOPE"}}, "code must be"),
        ({"PreCreateContainer": {"delay": -1}}, "delay must be"),
        ([], "config must be a JSON object"),
        ("/nonexistent/config.json", "cannot read config file"),
    ],
)
async def test_invalid_config_exits_2(sock_dir: Path, config: object, message: str) -> None:
    cfg = config if isinstance(config, str) else json.dumps(config)
    proc, stderr = await spawn(sock_dir, "--socket", str(sock_dir / "hook.sock"), "--config", cfg)
    assert proc.stdout is not None
    out = await asyncio.wait_for(proc.stdout.read(), START_TIMEOUT)
    assert await proc.wait() == 2
    assert b"ready" not in out
    assert message in stderr.read_text()
    with pytest.raises(ConfigError, match="."):
        load_config(cfg)


async def test_socket_in_use_exits_1(sock_dir: Path, servers: list[RunningServer]) -> None:
    first = await start_testserver(sock_dir, {})
    servers.append(first)
    proc, stderr = await spawn(sock_dir, "--socket", str(first.socket_path))
    assert await asyncio.wait_for(proc.wait(), START_TIMEOUT) == 1
    assert "in use" in stderr.read_text()
    # The first server is unaffected.
    assert await first.call(HookType.PRE_START_CONTAINER) == api_pb2.ContainerResourceHookResponse()
    assert await first.terminate() == 0
