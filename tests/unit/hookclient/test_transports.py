"""Both hook transports against real hook servers: the same answers and the same failures."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookAbort, HookServer
from runtimeproxy.hookclient.transport import CallFailed, HookTransport, transport_for
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

POINT = HOOK_POINTS[HookType.PRE_CREATE_CONTAINER]


class Echo(HookServer):
    """Answers with the request's annotations; some annotations make it misbehave."""

    def __init__(self, path: Path, transport: str) -> None:
        super().__init__(path, transport=transport)
        self.release = asyncio.Event()

    async def pre_create_container(
        self, request: hookapi.ContainerResourceHookRequest
    ) -> hookapi.ContainerResourceHookResponse:
        if "refuse" in request.container_annotations:
            raise HookAbort(grpc.StatusCode.FAILED_PRECONDITION, request.container_annotations["refuse"])
        if "hang" in request.container_annotations:
            await self.release.wait()
        return hookapi.ContainerResourceHookResponse(container_annotations=request.container_annotations)


@pytest.fixture(params=["frames", "grpc"], ids=lambda t: f"server-{t}")
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Echo]:
    async with Echo(tmp_path / "echo.sock", request.param) as echo:
        yield echo


@pytest.fixture(params=["frames", "grpc"], ids=lambda t: f"client-{t}")
async def client(request: pytest.FixtureRequest) -> AsyncIterator[HookTransport]:
    transport = transport_for(request.param)
    yield transport
    await transport.close(1)


def annotated(**annotations: str) -> bytes:
    return hookapi.ContainerResourceHookRequest(container_annotations=annotations).SerializeToString()


async def test_a_15_mib_request_and_answer(server: Echo, client: HookTransport) -> None:
    big = "x" * (15 << 20)
    raw = await client.call(server.socket_path, POINT.full_method, annotated(big=big), 30, owner_uid=None)
    assert hookapi.ContainerResourceHookResponse.FromString(raw).container_annotations["big"] == big


async def test_concurrent_calls_share_one_connection(server: Echo, client: HookTransport) -> None:
    answers = await asyncio.gather(
        *(client.call(server.socket_path, POINT.full_method, annotated(n=str(i) * 1000), 10, owner_uid=None) for i in range(32))
    )
    assert [hookapi.ContainerResourceHookResponse.FromString(a).container_annotations["n"] for a in answers] == [
        str(i) * 1000 for i in range(32)
    ]
    assert client.endpoints() == {server.socket_path}


async def test_a_refusal_reaches_the_caller_with_its_code_and_details(server: Echo, client: HookTransport) -> None:
    with pytest.raises(CallFailed) as err:
        await client.call(server.socket_path, POINT.full_method, annotated(refuse="not on this node"), 5, owner_uid=None)
    assert (err.value.code, err.value.details) == (grpc.StatusCode.FAILED_PRECONDITION, "not on this node")


async def test_an_unknown_method_is_unimplemented(server: Echo, client: HookTransport) -> None:
    with pytest.raises(CallFailed) as err:
        await client.call(server.socket_path, "/runtime.v1alpha1.RuntimeHookService/NoSuchHook", b"", 5, owner_uid=None)
    assert err.value.code == grpc.StatusCode.UNIMPLEMENTED


async def test_a_hanging_hook_is_bounded_by_the_timeout(server: Echo, client: HookTransport) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(CallFailed) as err:
        await client.call(server.socket_path, POINT.full_method, annotated(hang=""), 0.5, owner_uid=None)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert loop.time() - started < 2.5
    server.release.set()
    # The connection is still good for the next call.
    assert await client.call(server.socket_path, POINT.full_method, annotated(), 5, owner_uid=None) == b""


async def test_no_server_is_unavailable_and_a_restarted_one_is_called_again(tmp_path: Path, client: HookTransport) -> None:
    path = tmp_path / "restart.sock"
    with pytest.raises(CallFailed) as err:
        await client.call(str(path), POINT.full_method, annotated(), 2, owner_uid=None)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    for transport in ("frames", "grpc"):  # the server restarts, on the other transport
        async with Echo(path, transport):
            raw = await asyncio.wait_for(_until_answered(client, str(path)), 10)
            assert hookapi.ContainerResourceHookResponse.FromString(raw).container_annotations["k"] == "v"


async def _until_answered(client: HookTransport, path: str) -> bytes:
    """grpc's channel may still be in its reconnect backoff (at most 1 s) when the server is back."""
    while True:
        try:
            return await client.call(path, POINT.full_method, annotated(k="v"), 2, owner_uid=None)
        except CallFailed as err:
            assert err.code == grpc.StatusCode.UNAVAILABLE
            await asyncio.sleep(0.05)  # a retry pace, as grpc's backoff: nothing to await


async def test_a_very_long_refusal_reaches_the_caller_cut_and_the_connection_lives(
    server: Echo, client: HookTransport
) -> None:
    """A hook's error of 100 kB: the caller gets its code and (at least) the
    start of its text; a call in flight beside it is answered."""
    hang = asyncio.ensure_future(client.call(server.socket_path, POINT.full_method, annotated(hang="1"), 5, owner_uid=None))
    with pytest.raises(CallFailed) as err:
        await client.call(server.socket_path, POINT.full_method, annotated(refuse="é" + "x" * 100_000), 5, owner_uid=None)
    assert err.value.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED)
    if err.value.code == grpc.StatusCode.FAILED_PRECONDITION:
        assert err.value.details.startswith("éxxx") and len(err.value.details) < 10_000
    server.release.set()
    answer = hookapi.ContainerResourceHookResponse.FromString(await hang)
    assert answer.container_annotations == {"hang": "1"}


async def test_a_closed_frames_client_is_freed_at_once(server: Echo) -> None:
    """An answered call leaves the deadlines' timer set for its timeout, and a
    closed connection one for its flush, each holding on to what it would act
    on until then; closed, the client and what it owns go at once."""
    client = transport_for("frames")
    raw = await client.call(server.socket_path, POINT.full_method, annotated(a="1"), 60, owner_uid=None)
    assert hookapi.ContainerResourceHookResponse.FromString(raw).container_annotations == {"a": "1"}
    await client.close(1)
    alive, deadlines = weakref.ref(client), weakref.ref(client._deadlines)  # type: ignore[attr-defined]
    del client
    gc.collect()  # (its connections and it refer to each other)
    assert alive() is None and deadlines() is None
