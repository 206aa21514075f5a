"""The hook server the frameserver tests call, Scripted (it behaves as the container's
name says), on either SDK transport; its fixtures (each test module binds those it
uses, for pytest to find); and helpers to build a request and to collect a call's outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookAbort, HookServer
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

PRE_CREATE = HOOK_POINTS[HookType.PRE_CREATE_CONTAINER]
PRE_RUN = HOOK_POINTS[HookType.PRE_RUN_POD_SANDBOX]
LIMIT = 1 << 20  # both transports' message limit in these tests


class Scripted(HookServer):
    """Behaves as the container's name says."""

    def __init__(self, path: Path, transport: str) -> None:
        super().__init__(path, transport=transport, grace=0.5,
                         options=[("grpc.max_receive_message_length", LIMIT), ("grpc.max_send_message_length", LIMIT)])
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        if hook is HookType.PRE_RUN_POD_SANDBOX:
            assert isinstance(request, hookapi.PodSandboxHookRequest), request
            return hookapi.PodSandboxHookResponse(labels={"pod": request.pod_meta.name})
        assert isinstance(request, hookapi.ContainerResourceHookRequest), request  # the tests call container points only
        what = request.container_meta.name
        if what == "none":
            return None
        if what == "abort":
            raise HookAbort(grpc.StatusCode.PERMISSION_DENIED, "nein: ü 100% \n done")
        if what == "abort-ok":
            raise HookAbort(grpc.StatusCode.OK)
        if what == "abort-bare":
            raise HookAbort(grpc.StatusCode.FAILED_PRECONDITION)
        if what == "boom":
            raise ValueError("boom")
        if what == "wrong":
            return hookapi.PodSandboxHookResponse()
        if what == "big":
            return hookapi.ContainerResourceHookResponse(container_annotations={"big": "x" * (LIMIT + 10)})
        if what == "slow":  # outlasts a short grpc-timeout, well within 2 s
            await asyncio.sleep(0.5)
        if what == "wait":
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        size = int(what) if what.isdigit() else 0
        return hookapi.ContainerResourceHookResponse(container_annotations={"echo": "y" * size, "n": what})


@pytest.fixture(params=["frames", "grpc"])
async def server(request: pytest.FixtureRequest, sock_dir: Path) -> AsyncIterator[Scripted]:
    hook_server = Scripted(sock_dir / f"{request.param}.sock", request.param)
    async with hook_server:
        yield hook_server


@pytest.fixture
async def frames(sock_dir: Path) -> AsyncIterator[Scripted]:
    hook_server = Scripted(sock_dir / "f.sock", "frames")
    async with hook_server:
        yield hook_server


def hook_request_bytes(name: str, pad: int = 0) -> bytes:
    """A container hook request for Scripted: `name` says how it behaves; `pad` bytes of annotation make it large."""
    return hookapi.ContainerResourceHookRequest(
        container_meta=hookapi.ContainerMetadata(name=name),
        container_annotations={"pad": "p" * pad} if pad else {},
    ).SerializeToString()


async def call_outcome(channel: aio.Channel, method: str, body: bytes, timeout: float = 10) -> tuple[str, str, bytes]:
    """A unary call's status name, details and answer (empty unless OK)."""
    try:
        return "OK", "", await channel.unary_unary(method)(body, timeout=timeout)
    except aio.AioRpcError as err:
        return err.code().name, err.details() or "", b""
