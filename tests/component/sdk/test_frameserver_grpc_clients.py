"""The SDK's frames transport (hooks.frameserver) against grpc.aio clients: calls, deadlines,
cancellation, many large calls at once and gzip requests.

The differential test runs one set of calls on both transports: a grpc
client must not tell them apart, except in the wording of the errors grpc
itself writes (limits), where only the code is compared, and in the code of
an undecodable request (grpc.aio: UNKNOWN; frames: INTERNAL).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi

from . import scriptedserver
from .scriptedserver import LIMIT, PRE_CREATE, PRE_RUN, Scripted, call_outcome, hook_request_bytes

frames = scriptedserver.frames  # the fixtures, here for pytest to find
server = scriptedserver.server


CASES = [
    ("answer", PRE_CREATE.full_method, hook_request_bytes("12"), True),
    ("none", PRE_CREATE.full_method, hook_request_bytes("none"), True),
    ("pod", PRE_RUN.full_method, hookapi.PodSandboxHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="web")).SerializeToString(), True),
    ("abort", PRE_CREATE.full_method, hook_request_bytes("abort"), True),
    ("abort-bare", PRE_CREATE.full_method, hook_request_bytes("abort-bare"), True),
    ("abort-with-ok", PRE_CREATE.full_method, hook_request_bytes("abort-ok"), True),
    ("handler-raises", PRE_CREATE.full_method, hook_request_bytes("boom"), True),
    ("wrong-type", PRE_CREATE.full_method, hook_request_bytes("wrong"), True),
    ("unknown-method", "/runtime.v1alpha1.RuntimeHookService/NoSuchHook", b"", False),
    ("undecodable", PRE_CREATE.full_method, b"\xff\xff\xff", False),
    ("request-over-limit", PRE_CREATE.full_method, hook_request_bytes("1", pad=LIMIT), False),
    ("response-over-limit", PRE_CREATE.full_method, hook_request_bytes("big"), False),
    ("large-both-ways", PRE_CREATE.full_method, hook_request_bytes(str(LIMIT - 100), pad=LIMIT - 100), True),
]


@pytest.mark.parametrize(("case", "method", "body", "same_details"), CASES, ids=[c[0] for c in CASES])
async def test_a_grpc_client_sees_the_same_on_both_transports(
    sock_dir: Path, case: str, method: str, body: bytes, same_details: bool
) -> None:
    seen = {}
    for transport in ("frames", "grpc"):
        async with Scripted(sock_dir / f"d-{transport}.sock", transport) as hook_server:
            async with aio.insecure_channel(hook_server.target) as channel:
                seen[transport] = await call_outcome(channel, method, body)
                # The connection serves the next call after any of these.
                assert (await call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("none")))[0] == "OK"
    frames, grpc_ = seen["frames"], seen["grpc"]
    if case == "undecodable":
        # The one difference: grpc.aio reports its deserializer's exception as
        # UNKNOWN; the frames transport says what it is, INTERNAL.
        assert (frames[0], grpc_[0]) == ("INTERNAL", "UNKNOWN")
        assert "cannot decode the PreCreateContainerHook request" in frames[1]
        return
    if same_details:
        assert frames == grpc_
    else:
        assert (frames[0], frames[2]) == (grpc_[0], grpc_[2])
    assert frames[0] != "UNKNOWN"


async def test_deadline_cancels_the_handler(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        code, _, _ = await call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("wait"), timeout=0.3)
        await asyncio.wait_for(server.cancelled.wait(), 5)
    assert code == "DEADLINE_EXCEEDED"


async def test_a_client_that_cancels_cancels_the_handler(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        call = channel.unary_unary(PRE_CREATE.full_method)(hook_request_bytes("wait"), timeout=10)
        await asyncio.wait_for(server.started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(server.cancelled.wait(), 5)


async def test_many_large_calls_at_once_on_one_connection(frames: Scripted) -> None:
    size = LIMIT // 2
    async with aio.insecure_channel(frames.target) as channel:
        method = channel.unary_unary(PRE_CREATE.full_method, response_deserializer=hookapi.ContainerResourceHookResponse.FromString)
        large, small = hook_request_bytes(str(size), pad=size), hook_request_bytes("3")
        answers = await asyncio.gather(*(method(large, timeout=30) for _ in range(24)),
                                       *(method(small, timeout=30) for _ in range(50)))
    assert [len(a.container_annotations["echo"]) for a in answers] == [size] * 24 + [3] * 50


async def test_gzip_requests_are_served_as_on_grpc(sock_dir: Path) -> None:
    seen = {}
    for transport in ("frames", "grpc"):
        async with Scripted(sock_dir / f"z-{transport}.sock", transport) as hook_server:
            async with aio.insecure_channel(hook_server.target, compression=grpc.Compression.Gzip) as channel:
                body = hook_request_bytes("40", pad=50_000)
                seen[transport] = await call_outcome(channel, PRE_CREATE.full_method, body)
    assert seen["frames"] == seen["grpc"] and seen["frames"][0] == "OK"
