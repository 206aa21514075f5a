"""Dispatcher edge cases that need no hook-server process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookServer
from runtimeproxy.hookclient.transport import transport_for
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType, Kind
from runtimeproxy.hookpath.registry import HookSnapshot
from tests.hookrequests import request_for

HOOK = HookType.PRE_CREATE_CONTAINER


class OneServer:
    """A registry holding one hook server, whatever its file said."""

    def __init__(self, server: HookServerConfig) -> None:
        self.server = server

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        return (self.server,) if hook in self.server.hooks else ()

    def on_change(self, callback: Callable[[HookSnapshot], None]) -> None:
        pass


def server(policy: FailurePolicy) -> HookServerConfig:
    return HookServerConfig("odd.json", "/run/odd.sock", policy, frozenset({HOOK}), timeout=1.0)


class BrokenTransport:
    """A transport that fails in a way no hook call should (a bug, a library's surprise)."""

    async def call(self, endpoint: str, method: str, request: bytes, timeout: float) -> bytes:
        raise UnicodeEncodeError("utf-8", endpoint, 5, 6, "surrogates not allowed")

    def keep_only(self, endpoints: object, grace: float) -> None:
        pass

    def endpoints(self) -> frozenset[str]:
        return frozenset()

    async def close(self, grace: float) -> None:
        pass


async def build() -> hookapi.ContainerResourceHookRequest:
    return hookapi.ContainerResourceHookRequest()


async def test_unexpected_error_is_the_hooks_failure_under_fail() -> None:
    dispatcher = Dispatcher(OneServer(server(FailurePolicy.FAIL)), transport=BrokenTransport())  # type: ignore[arg-type]
    with pytest.raises(HookError) as excinfo:
        await dispatcher.run_pre(HOOK, build, lambda answer: True, {})
    assert "UnicodeEncodeError" in excinfo.value.cause
    assert "odd.json" in str(excinfo.value)
    await dispatcher.close()


async def test_unexpected_error_is_skipped_under_ignore() -> None:
    dispatcher = Dispatcher(OneServer(server(FailurePolicy.IGNORE)), transport=BrokenTransport())  # type: ignore[arg-type]
    assert await dispatcher.run_pre(HOOK, build, lambda answer: True, {}) is False
    await dispatcher.close()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_every_hook_point_is_called_with_its_rpc_and_classes(
    tmp_path_factory: pytest.TempPathFactory, transport: str
) -> None:
    """The dispatcher calls each hook point's RPC with its request class and
    decodes its response class (an in-process SDK server records what came)."""
    seen: list[tuple[HookType, type]] = []

    class Recording(HookServer):
        async def handle(self, hook: HookType, request: Message) -> Message | None:
            seen.append((hook, type(request)))
            answer = HOOK_POINTS[hook].response_type()
            getattr(answer, "labels" if HOOK_POINTS[hook].kind is Kind.POD else "container_annotations")["hook"] = hook.value
            return answer

    path = tmp_path_factory.mktemp("d", numbered=True) / "h.sock"
    async with Recording(path):
        config = HookServerConfig("h.json", str(path), FailurePolicy.FAIL, frozenset(HookType))
        dispatcher = Dispatcher(OneServer(config), transport=transport_for(transport))  # type: ignore[arg-type]
        try:
            for hook, point in HOOK_POINTS.items():
                answer = await dispatcher.call(dispatcher.servers(hook)[0], hook, request_for(hook))
                assert type(answer) is point.response_type
                got = answer.labels if point.kind is Kind.POD else answer.container_annotations
                assert got == {"hook": hook.value}
        finally:
            await dispatcher.close()
    assert seen == [(hook, point.request_type) for hook, point in HOOK_POINTS.items()]


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_a_slow_handshake_is_bounded_by_the_hook_timeout_not_by_grpc(
    tmp_path_factory: pytest.TempPathFactory, transport: str
) -> None:
    """A hook server that sends its first SETTINGS frame late (a busy node, a
    server starting up) is still called: connecting is part of the hook call,
    bounded by the hook's own timeout (grpc's own connect deadline was 0.1 s)."""
    directory = tmp_path_factory.mktemp("slow", numbered=True)
    real, slow = directory / "real.sock", directory / "slow.sock"
    delay = 0.4  # well over grpc's old 0.1 s, well under the 5 s hook timeout

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay)  # the handshake delay under test, not a wait for an event
        up_reader, up_writer = await asyncio.open_unix_connection(str(real))
        await asyncio.gather(_splice(reader, up_writer), _splice(up_reader, writer))

    relay = await asyncio.start_unix_server(late, path=str(slow))
    async with HookServer(real), relay:
        server = HookServerConfig("slow.json", str(slow), FailurePolicy.FAIL, frozenset({HOOK}), timeout=5.0)
        dispatcher = Dispatcher(OneServer(server), transport=transport_for(transport))  # type: ignore[arg-type]
        try:
            answer = await dispatcher.call(server, HOOK, request_for(HOOK))
            assert type(answer) is hookapi.ContainerResourceHookResponse
        finally:
            await dispatcher.close()
