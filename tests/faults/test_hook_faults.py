"""Hook servers that fail, stall, lie or answer absurdly, behind a proxy on the fake backend.

Whatever the hook does, the CRI call is bounded by the hook's timeout, its
failure policy is obeyed (Fail: refused, the runtime never asked; Ignore:
the runtime gets the very bytes kubelet sent) and nothing outside what hooks
may change reaches the runtime changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from hooks.sdk import write_hook_config
from runtimeproxy.app import RunningProxy
from runtimeproxy.hookpath.validate import read_node_facts
from runtimeproxy.host.unixsocket import grpc_address

from ..component.hookpath.crirequests import CREATE, backend_request, create_request
from ..hookprocs import hook_server, registered
from ..unit.hookpath.test_dispatch import _splice

TIMEOUT = 0.5
HOOK_TIMEOUT = f"{int(TIMEOUT * 1000)}ms"
# Scheduling on a loaded 2-core machine. Well under the calls' 10 s
# deadline, which a fault the hook's timeout did not end would run to.
SLACK = 5.0


class RawAnswerServer:
    """A hook server (in-process) answering every hook with fixed bytes."""

    def __init__(self, socket: Path, answer: bytes) -> None:
        self.socket = socket
        self.server = aio.server(options=[("grpc.max_send_message_length", 64 << 20)])

        async def reply(request: bytes, context: aio.ServicerContext) -> bytes:
            return answer

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):  # type: ignore[no-untyped-def]
                return grpc.unary_unary_rpc_method_handler(reply)

        self.server.add_generic_rpc_handlers((Handler(),))
        self.server.add_insecure_port(grpc_address(socket))

    async def __aenter__(self) -> RawAnswerServer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)


@contextlib.asynccontextmanager
async def late_handshake(directory: Path, real: Path, delay: float) -> AsyncIterator[Path]:
    """A socket in front of ``real`` whose server side says nothing for ``delay`` seconds."""
    slow = directory / f"slow-{real.stem}.sock"

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay)  # the handshake delay under test, not a wait for an event
        up_reader, up_writer = await asyncio.open_unix_connection(str(real))
        await asyncio.gather(_splice(reader, up_writer), _splice(up_reader, writer))

    relay = await asyncio.start_unix_server(late, path=str(slow))
    async with relay:
        yield slow


def invalid_utf8_answer() -> bytes:
    """A ContainerResourceHookResponse whose annotation value is not UTF-8 (proto3 strings must be)."""
    good = hookapi.ContainerResourceHookResponse(container_annotations={"k": "\x01"}).SerializeToString()
    assert good.endswith(b"\x01")
    return good[:-1] + b"\xff"


@contextlib.asynccontextmanager
async def faulty_hook(fault: str, directory: Path, hook_dir: Path, policy: str) -> AsyncIterator[str]:
    """A registered PreCreateContainer hook server with ``fault``; yields its name."""
    async with contextlib.AsyncExitStack() as stack:
        if fault in ("crash", "hang"):
            hook = await stack.enter_async_context(hook_server(directory, fault, {"PreCreateContainer": fault}))
            endpoint = hook.socket
        elif fault in ("garbage", "invalid-utf8"):
            answer = b"\xff\xff\xff" if fault == "garbage" else invalid_utf8_answer()
            endpoint = directory / f"{fault}.sock"
            await stack.enter_async_context(RawAnswerServer(endpoint, answer))
        else:  # a handshake slower than the hook's timeout, and than the bound (under Ignore only the bound tells)
            hook = await stack.enter_async_context(hook_server(directory, "real", {}))
            endpoint = await stack.enter_async_context(late_handshake(directory, hook.socket, TIMEOUT + SLACK + 1))
        write_hook_config(hook_dir, fault, endpoint, ["PreCreateContainer"], policy, HOOK_TIMEOUT)
        yield fault


@pytest.mark.parametrize("fault", ["crash", "hang", "slow-handshake", "garbage", "invalid-utf8"])
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_a_faulty_hook_is_bounded_and_its_policy_obeyed(running: RunningProxy, fake, client, sock_dir, hook_dir,
                                                              fault: str, policy: str) -> None:
    original = create_request().SerializeToString()
    async with faulty_hook(fault, sock_dir, hook_dir, policy) as name:
        await registered(running, 1)
        started = time.monotonic()
        call = client.unary_unary(CREATE)(original, timeout=10)
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert name in err.value.details()
            assert fake.calls(CREATE) == []
        else:
            await call
            assert fake.calls(CREATE)[0].requests == [original]  # not a byte changed
        elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT + SLACK, f"{fault}/{policy}: {elapsed:.2f}s"


async def test_a_slow_handshake_within_the_timeout_is_waited_for(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "real", {"PreCreateContainer": {"container_annotations": {"late": "yes"}}}) as hook:
        async with late_handshake(sock_dir, hook.socket, 0.5) as endpoint:
            write_hook_config(hook_dir, "late", endpoint, ["PreCreateContainer"], "Fail", "3s")
            await registered(running, 1)
            await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    assert backend_request(fake).config.annotations["late"] == "yes"


def only_allowed_fields_differ(sent: v1.CreateContainerRequest) -> None:
    """Apart from annotations, env and resources, the runtime got what kubelet sent."""
    expected = create_request()
    for message in (sent, expected):
        message.config.annotations.clear()
        del message.config.envs[:]
        message.config.linux.resources.Clear()
    assert sent == expected


@contextlib.asynccontextmanager
async def absurd_hook(sock_dir: Path, hook_dir: Path, running: RunningProxy, policy: str,
                      answer: dict) -> AsyncIterator[None]:
    config = sock_dir / "answer.json"
    config.write_text(json.dumps({"PreCreateContainer": answer}))
    async with hook_server(sock_dir, "absurd", config) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], policy, timeout="5s")
        await registered(running, 1)
        yield


async def test_a_1_mib_annotation_and_10000_env_entries_go_through(running, fake, client, sock_dir, hook_dir) -> None:
    """Within the 16 MiB message limit, a hook's large answer is applied as it is, order kept."""
    big = "x" * (1 << 20)
    envs = {f"V{i:05d}": str(i) for i in range(10_000)}
    answer = {"container_annotations": {"big": big}, "container_envs": envs}
    async with absurd_hook(sock_dir, hook_dir, running, "Fail", answer):
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=30)
    sent = backend_request(fake)
    assert sent.config.annotations == {"c-note": "y", "big": big}
    assert [(e.key, e.value) for e in sent.config.envs] == [
        ("KEEP", b"original"), ("RAW", b"\xff\xfe"), *((k, v.encode()) for k, v in envs.items())]
    only_allowed_fields_differ(sent)


async def test_a_hook_answer_above_4_mib_is_applied(running, fake, client, sock_dir, hook_dir) -> None:
    """A hook answer may be as large as the request it changes: grpc's 4 MiB default was the limit."""
    big = "x" * (5 << 20)
    async with absurd_hook(sock_dir, hook_dir, running, "Fail", {"container_annotations": {"big": big}}):
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=30)
    assert backend_request(fake).config.annotations["big"] == big


NODE = read_node_facts()
ABSURD = {
    "negative-quota": {"cpu_period": 100000, "cpu_quota": -5},
    # create_request's limit is 1 GiB: swap below it once merged, though fine alone.
    "swap-below-the-merged-memory": {"memory_swap_limit_in_bytes": 512 << 20},
    "cpus-that-do-not-exist": {"cpuset_cpus": f"0-{max(NODE.online_cpus) + 64}"},
    "period-below-1ms": {"cpu_period": 10},
}


@pytest.mark.parametrize("case", sorted(ABSURD))
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_values_the_kernel_would_refuse_are_refused_or_dropped(running, fake, client, sock_dir, hook_dir,
                                                                    case: str, policy: str) -> None:
    answer = {"container_resources": ABSURD[case], "container_annotations": {"absurd": "yes"}}
    original = create_request().SerializeToString()
    async with absurd_hook(sock_dir, hook_dir, running, policy, answer):
        call = client.unary_unary(CREATE)(original, timeout=10)
        if policy == "Fail":
            with pytest.raises(aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            field = list(ABSURD[case])[-1]  # the offending one
            assert "absurd" in err.value.details() and field in err.value.details()
            assert fake.calls(CREATE) == []
        else:
            await call
            assert fake.calls(CREATE)[0].requests == [original]  # the whole answer dropped


async def test_values_the_kernel_takes_pass_a_fail_hook(running, fake, client, sock_dir, hook_dir) -> None:
    """Not judged absurd: a memory limit far above the node's (limits overcommit;
    kubelet sends such limits itself) and cgroup v2 files with capitals."""
    big = 1 << 50
    answer = {"container_resources": {"memory_limit_in_bytes": big, "memory_swap_limit_in_bytes": big,
                                      "unified": {"hugetlb.2MB.max": "0"}}}
    async with absurd_hook(sock_dir, hook_dir, running, "Fail", answer):
        await client.unary_unary(CREATE)(create_request().SerializeToString(), timeout=10)
    sent = backend_request(fake).config.linux.resources
    assert (sent.memory_limit_in_bytes, sent.memory_swap_limit_in_bytes) == (big, big)
    assert dict(sent.unified) == {"hugetlb.2MB.max": "0"}


@pytest.mark.parametrize("size", [1 << 20, 6 << 20])
async def test_a_large_request_reaches_a_fail_hook_and_the_runtime(running, fake, client, sock_dir, hook_dir, size) -> None:
    """kubelet sends up to 16 MiB: a request that large is a hook's to see, not a reason to fail the pod."""
    request = create_request()
    request.config.annotations["big"] = "x" * size
    for i in range(10_000):
        request.config.envs.add(key=f"E{i:05d}", value=b"v")
    async with hook_server(sock_dir, "noop", {"PreCreateContainer": {"container_annotations": {"seen": "yes"}}}) as hook:
        hook.register(hook_dir, ["PreCreateContainer"], "Fail", timeout="5s")
        await registered(running, 1)
        await client.unary_unary(CREATE)(request.SerializeToString(), timeout=30)
        seen = hook.requests("PreCreateContainer")[0]
    assert len(seen["container_annotations"]["big"]) == size and len(seen["container_envs"]) == 10_001
    sent = backend_request(fake)
    assert sent.config.annotations["big"] == "x" * size and sent.config.annotations["seen"] == "yes"
    assert len(sent.config.envs) == 10_002
