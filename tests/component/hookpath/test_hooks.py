"""Issue 4 against a fake backend that shows exactly what reached it, with
real hook-server processes: what hooks change, chained, and what a failing
or undecodable hook may not do to a call."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1alpha2 import api_pb2 as v1alpha2
from runtimeproxy.host.unixsocket import grpc_address

from ...hookprocs import hook_server, registered
from .crirequests import CREATE, QUOTA_HOOK, REMOVE, START, STOP, backend_request, create_request


async def test_without_hooks_the_original_bytes_go_through(running, fake, client) -> None:
    raw = create_request().SerializeToString() + b"\xba\x3e\x01z"  # plus an unknown field
    await client.unary_unary(CREATE)(raw)
    assert fake.calls(CREATE)[0].requests == [raw]


async def test_pre_create_hook_changes_only_what_hooks_may(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        original = create_request()
        reply = await client.unary_unary(CREATE)(original.SerializeToString())
        assert v1.CreateContainerResponse.FromString(reply).container_id == "ctr-1"

    sent = backend_request(fake)
    res = sent.config.linux.resources
    assert (res.cpu_period, res.cpu_quota, res.memory_limit_in_bytes) == (100000, 20000, 64 << 20)
    assert res.cpu_shares == 256  # left unset by the hook: original kept
    assert sent.config.annotations == {"c-note": "y", "hooked-by": "quota"}
    assert [(e.key, e.value) for e in sent.config.envs] == [
        ("KEEP", b"overridden"), ("RAW", b"\xff\xfe"), ("HOOKED", b"1")
    ]
    # Everything else is untouched.
    expected = create_request()
    for msg in (sent, expected):
        msg.config.linux.resources.Clear()
        msg.config.annotations.clear()
        del msg.config.envs[:]
    assert sent == expected
    # The hook saw the request as kubelet sent it (non-UTF-8 env left out).
    seen = hook.requests("PreCreateContainer")[0]
    assert seen["container_envs"] == {"KEEP": "original"}
    assert seen["pod_meta"]["uid"] == "uid-1"
    assert seen["pod_cgroup_parent"] == "/kubepods/burstable/poduid-1"
    assert seen["container_resources"]["cpu_shares"] == "256"


async def test_v1alpha2_client_is_hooked_too(running, fake, client, sock_dir, hook_dir) -> None:
    path = "/runtime.v1alpha2.RuntimeService/CreateContainer"
    fake.script(path, response=v1alpha2.CreateContainerResponse(container_id="ctr-2").SerializeToString())
    request = v1alpha2.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=v1alpha2.ContainerConfig(metadata=v1alpha2.ContainerMetadata(name="old")),
        sandbox_config=v1alpha2.PodSandboxConfig(metadata=v1alpha2.PodSandboxMetadata(name="p", uid="u")),
    )
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(path)(request.SerializeToString())
    sent = v1alpha2.CreateContainerRequest.FromString(fake.calls(path)[0].requests[0])
    assert sent.config.linux.resources.cpu_quota == 20000
    assert {e.key: e.value for e in sent.config.envs} == {"HOOKED": "1", "KEEP": "overridden"}


async def test_chaining_in_priority_then_name_order(running, fake, client, sock_dir, hook_dir) -> None:
    first = {"PreCreateContainer": {"container_resources": {"cpu_quota": 10000}, "container_annotations": {"order": "first"}}}
    second = {"PreCreateContainer": {"container_resources": {"cpu_quota": 30000}, "container_annotations": {"second": "yes"}}}
    async with hook_server(sock_dir, "b-first", first) as a, hook_server(sock_dir, "a-second", second) as b:
        a.register(hook_dir, ["PreCreateContainer"], priority=-5)
        b.register(hook_dir, ["PreCreateContainer"], priority=10)
        await registered(running, 2)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        # The second saw the first's changes.
        seen = b.requests("PreCreateContainer")[0]
        assert seen["container_resources"]["cpu_quota"] == "10000"
        assert seen["container_annotations"]["order"] == "first"
        assert a.requests("PreCreateContainer")[0]["container_annotations"] == {"c-note": "y"}
    sent = backend_request(fake)
    assert sent.config.linux.resources.cpu_quota == 30000
    assert sent.config.annotations["order"] == "first" and sent.config.annotations["second"] == "yes"


async def test_chain_sees_pod_cgroup_parent_set_by_earlier_hook(running, fake, client, sock_dir, hook_dir) -> None:
    mover = {"PreCreateContainer": {"pod_cgroup_parent": "/kubepods/besteffort/moved"}}
    async with hook_server(sock_dir, "a", mover) as a, hook_server(sock_dir, "b", {"PreCreateContainer": {}}) as b:
        a.register(hook_dir, ["PreCreateContainer"], priority=1)
        b.register(hook_dir, ["PreCreateContainer"], priority=2)
        await registered(running, 2)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert b.requests("PreCreateContainer")[0]["pod_cgroup_parent"] == "/kubepods/besteffort/moved"
    assert backend_request(fake).sandbox_config.linux.cgroup_parent == "/kubepods/besteffort/moved"
    assert running.store.containers["ctr-1"].pod_cgroup_parent == "/kubepods/besteffort/moved"


async def test_skip_label_bypasses_hooks(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "quota", QUOTA_HOOK) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        raw = create_request(**{"runtimeproxy.koordinator.sh/skip-hookserver": "true"}).SerializeToString()
        await client.unary_unary(CREATE)(raw)
        assert fake.calls(CREATE)[0].requests == [raw]
        assert hook.requests() == []


FAULTS = {
    "error": {"PreCreateContainer": {"behaviour": "error", "message": "policy engine says no"}},
    "hang": {"PreCreateContainer": "hang"},
    "crash": {"PreCreateContainer": {"behaviour": "crash"}},
}


@pytest.mark.parametrize("fault", ["absent", "error", "hang", "crash"])
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_failure_policies(running, fake, client, sock_dir, hook_dir, fault, policy) -> None:
    timeout = 0.5
    async with contextlib.AsyncExitStack() as stack:
        if fault == "absent":
            from hooks.sdk import write_hook_config

            write_hook_config(hook_dir, "gone", sock_dir / "nobody-listens.sock", ["PreCreateContainer"], policy, f"{int(timeout * 1000)}ms")
        else:
            hook = await stack.enter_async_context(hook_server(sock_dir, "faulty", FAULTS[fault]))
            hook.register(hook_dir, ["PreCreateContainer"], policy, timeout=f"{int(timeout * 1000)}ms")
        await registered(running, 1)
        started = time.monotonic()
        call = client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "faulty" in err.value.details() or "gone" in err.value.details()
            assert fake.calls(CREATE) == []  # the backend was never asked
        else:
            await call
            assert backend_request(fake) == create_request()  # unmodified
        elapsed = time.monotonic() - started
        # Well under the call's 10 s deadline, which a hang the hook's timeout did not end would run to.
        assert elapsed < timeout + 5.0, f"{fault}/{policy} took {elapsed:.2f}s"


@pytest.mark.parametrize("behaviour", ["error", "hang"])
async def test_post_hook_failure_never_fails_or_delays_the_call(running, fake, client, sock_dir, hook_dir, behaviour) -> None:
    async with hook_server(sock_dir, "post", {"PostStopContainer": {"behaviour": behaviour}}) as hook:
        # A hang runs to the hook's 5 s timeout: the bounds below are under it.
        hook.register(hook_dir, ["PostStopContainer"], "Fail", timeout="5s")
        await registered(running, 1)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        started = time.monotonic()
        await client.unary_unary(STOP)(v1.StopContainerRequest(container_id="ctr-1").SerializeToString(), timeout=4)
        assert time.monotonic() - started < 3.0  # the answer does not wait for post hooks
        # Nor does the next call on the same container, which has no hook to order.
        await client.unary_unary(REMOVE)(v1.RemoveContainerRequest(container_id="ctr-1").SerializeToString(), timeout=3)
        await running.hooks.drain()
        assert len(hook.requests("PostStopContainer")) == 1
        assert hook.requests("PostStopContainer")[0]["container_meta"]["id"] == "ctr-1"


class GarbageHookServer:
    """Answers every hook with bytes that are no hook response."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.server = aio.server()

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):  # type: ignore[no-untyped-def]
                async def answer(request: bytes, context: aio.ServicerContext) -> bytes:
                    return b"\xff\xff\xff"

                return grpc.unary_unary_rpc_method_handler(answer)

        self.server.add_generic_rpc_handlers((Handler(),))
        self.server.add_insecure_port(grpc_address(socket))


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_undecodable_hook_answer_follows_the_policy(running, fake, client, sock_dir, hook_dir, policy) -> None:
    from hooks.sdk import write_hook_config

    garbage = GarbageHookServer(sock_dir / "garbage.sock")
    await garbage.server.start()
    try:
        write_hook_config(hook_dir, "garbage", garbage.socket, ["PreCreateContainer"], policy, "1s")
        await registered(running, 1)
        call = client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=5)
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "garbage" in err.value.details() and "not a valid" in err.value.details()
            assert fake.calls(CREATE) == []
        else:
            await call
            assert backend_request(fake) == create_request()
    finally:
        await garbage.server.stop(0)


@pytest.mark.parametrize("path", [CREATE, STOP], ids=["serialised", "ordered-until-issued"])
async def test_runtime_errors_on_hooked_calls_reach_the_client_unchanged(running, fake, client, sock_dir, hook_dir, path) -> None:
    trailing = (("x-runtime-detail", "gone"),)
    fake.script(path, code=grpc.StatusCode.NOT_FOUND, details="container not found", trailing=trailing)
    async with hook_server(sock_dir, "any", {}) as hook:
        hook.register(hook_dir, ["PreCreateContainer", "PostStopContainer"])
        await registered(running, 1)
        request = create_request() if path == CREATE else v1.StopContainerRequest(container_id="ctr-1")
        with pytest.raises(aio.AioRpcError) as err:
            await client.unary_unary(path)(request.SerializeToString(), timeout=5)
        await running.hooks.drain()
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, "container not found")
        assert ("x-runtime-detail", "gone") in tuple(err.value.trailing_metadata() or ())
        assert "PostStopContainer" not in [r["hook"] for r in hook.records()]  # post hooks follow success only
    assert len(running.hooks.locks) == 0


@pytest.mark.parametrize("path", [START, STOP], ids=["serialised", "ordered-until-issued"])
async def test_client_cancel_of_a_hooked_call_reaches_the_runtime(running, fake, client, path) -> None:
    await client.unary_unary(CREATE)(create_request().SerializeToString())
    fake.script(path, hang=True)
    request = (v1.StartContainerRequest if path == START else v1.StopContainerRequest)(container_id="ctr-1")
    call = client.unary_unary(path)(request.SerializeToString(), timeout=10)
    await fake.wait_calls(path)
    call.cancel()
    await asyncio.wait_for(fake.cancel_seen.wait(), 5)
    assert fake.cancelled == [path]
    async with asyncio.timeout(5):
        while len(running.hooks.locks):  # noqa: ASYNC110 - the handler unwinds after the cancel; the lock table has no event; bounded
            await asyncio.sleep(0.01)
