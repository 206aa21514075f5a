"""Tests of runtimeproxy.hookpath.registry: the registry's thread (the event loop's), the
only one it reloads, subscribes and watches on, and a reload closing a removed server's connection.

Real files in tmp_path, a real hook server on each hook transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2 as hookapi
from hooks.sdk import HookServer
from runtimeproxy.hookclient.connection import ClientConnection
from runtimeproxy.hookclient.grpcaio import GrpcTransport
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import HookTransport, transport_for
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry

from . import registrydir
from .registrydir import valid_doc, write

hook_dir = registrydir.hook_dir  # the fixture, here for pytest to find

POST_HOOK = HookType.POST_STOP_CONTAINER


class Held:
    """The connection (channel) a transport holds to an endpoint now."""

    def __init__(self, transport: HookTransport, endpoint: str) -> None:
        if isinstance(transport, FramesTransport):
            self._conn: ClientConnection | None = transport._connections[endpoint]
        else:
            assert isinstance(transport, GrpcTransport)
            self._conn, self._channel = None, transport._channels[endpoint]

    def is_closed(self) -> bool:
        if self._conn is not None:
            return self._conn.lost.done()
        return self._channel.get_state() is grpc.ChannelConnectivity.SHUTDOWN

    async def wait_closed(self) -> None:
        if self._conn is not None:
            await asyncio.shield(self._conn.lost)
            return
        while (state := self._channel.get_state()) is not grpc.ChannelConnectivity.SHUTDOWN:
            await self._channel.wait_for_state_change(state)


async def call_post(registry: HookRegistry, dispatcher: Dispatcher) -> None:
    """One successful post hook call (``run_post`` would swallow a failure)."""
    (server,) = registry.servers_for(POST_HOOK)
    await dispatcher.call(server, POST_HOOK, hookapi.ContainerResourceHookRequest())


@pytest.fixture(params=["frames", "grpc"])
async def dispatcher_with_open_connection(
    request: pytest.FixtureRequest, hook_dir: Path, tmp_path: Path
) -> AsyncIterator[tuple[HookRegistry, Dispatcher, str]]:
    """A registry with one post hook server and a dispatcher (on each
    transport) that has called it once, so holds a connection to it."""
    endpoint = str(tmp_path / "post-hook.sock")
    write(hook_dir, "post.json", valid_doc(endpoint, **{"runtime-hooks": [POST_HOOK.value]}))
    registry = HookRegistry(hook_dir)
    registry.reload()
    dispatcher = Dispatcher(registry, transport=transport_for(request.param))
    async with HookServer(endpoint):
        await call_post(registry, dispatcher)
        assert dispatcher.transport.endpoints() == {endpoint}
        try:
            yield registry, dispatcher, endpoint
        finally:
            await dispatcher.close()


async def test_reload_that_removes_a_server_closes_its_connection(
    hook_dir: Path, dispatcher_with_open_connection: tuple[HookRegistry, Dispatcher, str]
) -> None:
    registry, dispatcher, endpoint = dispatcher_with_open_connection
    held = Held(dispatcher.transport, endpoint)
    (hook_dir / "post.json").unlink()
    assert registry.reload().removed == ("post.json",)
    assert dispatcher.transport.endpoints() == frozenset()
    await asyncio.wait_for(held.wait_closed(), 5)


async def test_reload_from_another_thread_is_refused_and_changes_nothing(
    hook_dir: Path, dispatcher_with_open_connection: tuple[HookRegistry, Dispatcher, str]
) -> None:
    """A reload elsewhere than on the loop's thread used to run the callbacks there: the
    dispatcher forgot the removed server's channel but could not close it (no loop)."""
    registry, dispatcher, endpoint = dispatcher_with_open_connection
    held = Held(dispatcher.transport, endpoint)
    (hook_dir / "post.json").unlink()
    with pytest.raises(RuntimeError, match=r"HookRegistry\.reload\(\) called from thread .* belongs to thread"):
        await asyncio.to_thread(registry.reload)
    # Nothing happened: the server is still registered (readable from any
    # thread), and the dispatcher still holds and uses its one connection.
    assert [s.name for s in await asyncio.to_thread(registry.servers_for, POST_HOOK)] == ["post.json"]
    await call_post(registry, dispatcher)
    assert dispatcher.transport.endpoints() == {endpoint}
    assert Held(dispatcher.transport, endpoint).__dict__ == held.__dict__  # the same connection
    assert not held.is_closed()


async def test_on_change_and_watch_refuse_another_thread(hook_dir: Path) -> None:
    registry = HookRegistry(hook_dir)
    with pytest.raises(RuntimeError, match=r"HookRegistry\.on_change\(\) called from thread"):
        await asyncio.to_thread(registry.on_change, lambda snapshot: None)
    stopped = asyncio.Event()
    stopped.set()  # were it accepted, watch() would return at once rather than run forever
    with pytest.raises(RuntimeError, match=r"HookRegistry\.watch\(\) called from thread"):
        await asyncio.to_thread(asyncio.run, registry.watch(stopped))
