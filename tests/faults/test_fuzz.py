"""Bad CRI input: fuzzed request bytes of the hooked methods, and fuzzed HTTP/2 frames.

The proxy (every feature, a no-op Fail hook on every hook point, the fake
backend) answers each request with the backend's answer or INVALID_ARGUMENT,
never crashes, keeps serving the next good client and leaves no task behind.

Examples per test: ``RUNTIME_PROXY_FUZZ_EXAMPLES`` (CI: the small default,
derandomized so a run is reproducible); ``python -m bench fuzz`` runs many more.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from grpc import aio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.app import RunningProxy
from runtimeproxy.hookpath.executor import HOOKED_METHODS
from runtimeproxy.hookpath.points import HOOK_POINTS

from ..component.hookpath.crirequests import create_request, sandbox_config
from ..hookprocs import hook_server, registered

EXAMPLES = int(os.environ.get("RUNTIME_PROXY_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(
    max_examples=EXAMPLES or 200,
    derandomize=EXAMPLES is None,  # CI: the same examples every run
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CALL_TIMEOUT = 10.0
# The answers a fuzzed request may get: the fake backend's (OK: it answers
# whatever reaches it), or the proxy's refusal of a request it cannot read.
ACCEPTABLE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}

SEEDS: dict[str, bytes] = {
    "RunPodSandbox": v1.RunPodSandboxRequest(config=sandbox_config(), runtime_handler="runc").SerializeToString(),
    "CreateContainer": create_request().SerializeToString(),
    "UpdateContainerResources": v1.UpdateContainerResourcesRequest(
        container_id="ctr-1", linux=v1.LinuxContainerResources(cpu_quota=5000, cpuset_cpus="0"),
        annotations={"a": "b"}).SerializeToString(),
    **{m: getattr(v1, f"{m}Request")(container_id="ctr-1").SerializeToString()
       for m in ("StartContainer", "StopContainer", "RemoveContainer")},
    **{m: getattr(v1, f"{m}Request")(pod_sandbox_id="pod-1").SerializeToString()
       for m in ("StopPodSandbox", "RemovePodSandbox")},
}
assert SEEDS.keys() == HOOKED_METHODS.keys()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request with some bytes replaced, cut short or extended."""
    data = bytearray(SEEDS[draw(st.sampled_from(sorted(SEEDS)))])
    for position, value in draw(st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=6)):
        data[position % len(data)] = value
    if draw(st.booleans()):
        del data[draw(st.integers(0, len(data))):]
    return bytes(data) + draw(st.binary(max_size=16))


REQUEST_BYTES = st.one_of(mutated(), st.binary(max_size=300))
METHOD_PATHS = st.sampled_from([f"/runtime.{version}.RuntimeService/{method}"
                                for version in ("v1", "v1alpha2") for method in sorted(HOOKED_METHODS)])


@pytest.fixture
async def hooked(running: RunningProxy, fake, sock_dir, hook_dir):
    """The proxy with a no-op Fail hook on every hook point. The fake has no
    pod or container: a read back of one is NOT_FOUND, as from a real runtime
    (an unreadable one refuses the call under Fail)."""
    for version in ("v1", "v1alpha2"):
        for status in ("PodSandboxStatus", "ContainerStatus"):
            fake.script(f"/runtime.{version}.RuntimeService/{status}", code=grpc.StatusCode.NOT_FOUND)
    async with hook_server(sock_dir, "noop", {}) as hook:
        # 10 s: one no-op answer slowed by a loaded machine must not refuse a call (FAILED_PRECONDITION).
        hook.register(hook_dir, [h.value for h in HOOK_POINTS], "Fail", timeout="10s")
        await registered(running, 1)
        yield running


async def tasks_with_a_connection(client: aio.Channel) -> set[asyncio.Task[Any]]:
    """The tasks once ``client`` is connected (on the frames path a connection
    has a task of its own, for as long as it is open)."""
    await client.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=CALL_TIMEOUT)
    return asyncio.all_tasks()


async def settled(running: RunningProxy, before: set[asyncio.Task[Any]], timeout: float = 10.0) -> int:
    """The number of tasks once the proxy finished what the calls started
    (at most ``timeout``): grpc ends a call's task just after its answer left."""
    await running.hooks.drain()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(tasks := asyncio.all_tasks()) > len(before) and (left := deadline - loop.time()) > 0:
        await asyncio.wait(tasks - before - {asyncio.current_task()}, timeout=left,
                           return_when=asyncio.FIRST_COMPLETED)
    return len(asyncio.all_tasks())


def in_thread(loop: asyncio.AbstractEventLoop, make: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Hypothesis drives sync functions: run each example's coroutine on the test's loop."""
    def run(*args: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(make(*args), loop).result(60)
    return run


async def test_fuzzed_requests_of_hooked_methods(hooked: RunningProxy, client: aio.Channel) -> None:
    loop = asyncio.get_running_loop()
    before = await tasks_with_a_connection(client)
    unexpected: list[str] = []

    async def one(path: str, body: bytes) -> None:
        try:
            await client.unary_unary(path)(body, timeout=CALL_TIMEOUT)
        except aio.AioRpcError as exc:
            if exc.code() not in ACCEPTABLE:
                unexpected.append(f"{path} {body!r}: {exc.code().name}: {exc.details()}")

    call = in_thread(loop, one)

    @FUZZ
    @given(path=METHOD_PATHS, body=REQUEST_BYTES)
    def fuzz(path: str, body: bytes) -> None:
        call(path, body)

    await asyncio.to_thread(fuzz)
    assert unexpected == []
    assert await settled(hooked, before) <= len(before), [t.get_name() for t in asyncio.all_tasks()]
    answer = await client.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=CALL_TIMEOUT)
    assert v1.VersionResponse.FromString(answer).runtime_name == "fake"


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS_FRAME = struct.pack(">I", 0)[1:] + b"\x04\x00\x00\x00\x00\x00"  # empty SETTINGS on stream 0


@st.composite
def frame(draw: st.DrawFn) -> bytes:
    payload = draw(st.binary(max_size=64))
    length = len(payload) if draw(st.booleans()) else draw(st.integers(0, (1 << 24) - 1))  # a lying length too
    kind = draw(st.one_of(st.integers(0, 9), st.integers(0, 255)))
    flags = draw(st.integers(0, 255))
    stream = draw(st.one_of(st.sampled_from([0, 1, 3, 5, 0x7FFFFFFF]), st.integers(0, 0xFFFFFFFF)))
    return struct.pack(">I", length)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


FRAMES = st.tuples(st.booleans(), st.lists(frame(), max_size=6))


async def test_fuzzed_http2_frames(hooked: RunningProxy, client: aio.Channel, sock_dir) -> None:
    loop = asyncio.get_running_loop()
    socket = str(sock_dir / "proxy.sock")
    before = await tasks_with_a_connection(client)
    version = client.unary_unary("/runtime.v1.RuntimeService/Version")

    async def one(settings_first: bool, frames: list[bytes]) -> None:
        reader, writer = await asyncio.open_unix_connection(socket)
        try:
            writer.write(PREFACE + (SETTINGS_FRAME if settings_first else b"") + b"".join(frames))
            await writer.drain()
            # Whatever the proxy answers (GOAWAY, SETTINGS, nothing): read a little, never wait long.
            try:
                await asyncio.wait_for(reader.read(4096), 0.05)
            except TimeoutError:
                pass
        except ConnectionError:
            pass  # the proxy may hang up on garbage: that is an answer
        finally:
            writer.close()
        answer = await version(b"", timeout=CALL_TIMEOUT)  # the next good client is served
        assert v1.VersionResponse.FromString(answer).runtime_name == "fake"

    call = in_thread(loop, one)

    @FUZZ
    @given(case=FRAMES)
    def fuzz(case: tuple[bool, list[bytes]]) -> None:
        call(*case)

    await asyncio.to_thread(fuzz)
    assert await settled(hooked, before) <= len(before), [t.get_name() for t in asyncio.all_tasks()]
    async with aio.insecure_channel(f"unix://{socket}") as fresh:
        answer = await fresh.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=CALL_TIMEOUT)
    assert v1.VersionResponse.FromString(answer).runtime_name == "fake"


MARK = "@@BAD@@"  # replaced by as many bytes that are not UTF-8: lengths stay right


def undecodable(method: str) -> bytes:
    """A request of ``method`` containerd would take but Python's proto3 parser refuses (a non-UTF-8 string)."""
    if method == "RunPodSandbox":
        request: Any = v1.RunPodSandboxRequest(config=sandbox_config(team=MARK))
    elif method == "CreateContainer":
        request = create_request(team=MARK)
    else:
        request = getattr(v1, f"{method}Request")(container_id=f"ctr-{MARK}")
    body = request.SerializeToString().replace(MARK.encode(), b"\xff\xfe\xfd\xfc\xfb\xfa\xf9")
    # upb's and the C++ parser's DecodeError; the pure-Python one lets the UnicodeDecodeError through.
    with pytest.raises((DecodeError, UnicodeDecodeError)):
        type(request).FromString(body)
    return body


PRE_HOOKED = sorted(m for m, point in HOOKED_METHODS.items() if point.pre is not None)


@pytest.mark.parametrize("method", PRE_HOOKED)
async def test_an_undecodable_request_is_refused_when_a_fail_hook_waits_for_it(hooked, fake, client, method) -> None:
    path = f"/runtime.v1.RuntimeService/{method}"
    refused = {"method": method, "outcome": "undecodable"}
    before = hooked.metrics.registry.get_sample_value("runtime_proxy_hooked_calls_total", refused) or 0
    with pytest.raises(aio.AioRpcError) as err:
        await client.unary_unary(path)(undecodable(method), timeout=CALL_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert method in err.value.details()
    assert fake.calls(path) == []
    assert hooked.metrics.registry.get_sample_value("runtime_proxy_hooked_calls_total", refused) == before + 1


@pytest.mark.parametrize("method", PRE_HOOKED)
async def test_an_undecodable_request_goes_on_with_only_ignore_hooks(running, fake, client, sock_dir, hook_dir,
                                                                     method) -> None:
    path = f"/runtime.v1.RuntimeService/{method}"
    body = undecodable(method)
    async with hook_server(sock_dir, "noop", {}) as hook:
        hook.register(hook_dir, [h.value for h in HOOK_POINTS], "Ignore", timeout="2s")
        await registered(running, 1)
        await client.unary_unary(path)(body, timeout=CALL_TIMEOUT)
    assert fake.calls(path)[0].requests == [body]  # the runtime judges it, as without the proxy
