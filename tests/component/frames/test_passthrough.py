"""On the frames path, a call whose stages have no work for it is relayed
verbatim (routes.py, ``StageProvider.needed``): with no hook server
registered, the start and stop calls, of which the proxy records nothing.
"""

from __future__ import annotations

import asyncio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import RunningProxy

from ...hookprocs import hook_server, registered
from ..fakes import FakeBackend

START = "/runtime.v1.RuntimeService/StartContainer"
STOP = "/runtime.v1.RuntimeService/StopContainer"
STOP_POD = "/runtime.v1.RuntimeService/StopPodSandbox"
REMOVE = "/runtime.v1.RuntimeService/RemoveContainer"
UNKNOWN_FIELD = b"\xba\x3e\x01z"  # field 999, which no CRI message has


def staged(running: RunningProxy, method: str) -> float:
    """Calls of ``method`` that went through the hook stage."""
    value = running.metrics.registry.get_sample_value(
        "runtime_proxy_hooked_calls_total", {"method": method, "outcome": "ok"}
    )
    return value or 0.0


async def test_without_hook_servers_start_and_stop_calls_skip_the_stage(running, fake: FakeBackend, client) -> None:
    calls = [
        (START, v1.StartContainerRequest(container_id="ctr-1")),
        (STOP, v1.StopContainerRequest(container_id="ctr-1", timeout=5)),
        (STOP_POD, v1.StopPodSandboxRequest(pod_sandbox_id="pod-1")),
    ]
    for path, request in calls:
        raw = request.SerializeToString() + UNKNOWN_FIELD
        await client.unary_unary(path)(raw, timeout=10)
        assert fake.calls(path)[0].requests == [raw]
    assert [staged(running, path.rsplit("/", 1)[1]) for path, _ in calls] == [0, 0, 0]
    # A call the proxy records still takes the stage.
    await client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    assert staged(running, "RemoveContainer") == 1


async def test_a_hook_server_for_any_point_puts_them_back_on_the_stage(
    running, fake: FakeBackend, client, sock_dir, hook_dir
) -> None:
    async with hook_server(sock_dir, "create", {"PreCreateContainer": {}}) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    assert staged(running, "StartContainer") == 1


async def test_a_start_behind_a_call_in_the_stage_waits_its_turn(running, fake: FakeBackend, client) -> None:
    """A removal at the runtime holds its container: a start for it that
    arrives meanwhile takes the stage and reaches the runtime after it."""
    fake.script(REMOVE, hang=True)
    removing = asyncio.ensure_future(
        client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    )
    await fake.wait_calls(REMOVE)
    starting = asyncio.ensure_future(
        client.unary_unary(START)(v1.StartContainerRequest(container_id="ctr-1").SerializeToString(), timeout=10)
    )
    async with asyncio.timeout(5):
        while running.hooks.locks.users("ctr-1") < 2:  # the start waits behind the removal
            await asyncio.sleep(0.01)
    assert fake.calls(START) == []
    fake.scripts[REMOVE].release.set()
    await asyncio.wait_for(asyncio.gather(removing, starting), 10)
    assert [r.path for r in fake.received if r.path in (REMOVE, START)] == [REMOVE, START]
    assert staged(running, "StartContainer") == 1
