"""An in-process fake CRI backend that records the exact bytes it receives.

A real runtime cannot show what the proxy does to bytes, metadata, faults
and streams; this one can. It serves a chosen set of CRI versions and any
method path (including ones our protos do not know), answering each call
with a scripted behaviour.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.cripath import methods
from runtimeproxy.cripath.registered import NO_SUCH_METHOD
from runtimeproxy.host.unixsocket import grpc_address


@dataclass
class Received:
    path: str
    requests: list[bytes]
    metadata: dict[str, Any]
    time_remaining: float | None
    at: float = field(default_factory=time.monotonic)  # when the handler had it (after time_remaining was read)


@dataclass
class Script:
    """What the fake answers for one path."""

    response: bytes = b""
    stream: list[bytes] | None = None  # server-streaming: these messages, then OK
    code: grpc.StatusCode | None = None  # abort with this code
    details: str = ""
    trailing: tuple[tuple[str, str | bytes], ...] = ()
    initial: tuple[tuple[str, str | bytes], ...] = ()
    hang: bool = False  # answer only once ``release`` is set (or never)
    delay: float = 0.0  # answer this long after the call arrives (a slow runtime)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    echo: bool = False  # answer with the request bytes
    stream_forever: bool = False  # keep streaming until cancelled
    read_after_release: bool = False  # read the request only once ``release`` is set: a runtime that stops reading
    holding: asyncio.Event = field(default_factory=asyncio.Event)  # set once such a call waits, unread
    unread: bool = False  # answer with ``code`` before reading the request (as a runtime refusing a call at its headers)


# What the proxy's backend probe calls (cripath/backend.py): Version in each
# CRI version (v1alpha2 first asked by a method that does not exist, which
# this fake answers OK unless ``go_unknown``: cripath/registered.py), then
# RuntimeService/Status (is the runtime initialised).
PROBE_SUFFIXES = ("/Version", ".RuntimeService/Status", f".RuntimeService/{NO_SUCH_METHOD}")


def is_probe(path: str) -> bool:
    return path.endswith(PROBE_SUFFIXES)


def version_response(version: str) -> bytes:
    return v1.VersionResponse(
        version="0.1.0", runtime_name="fake", runtime_version="1.0", runtime_api_version=version
    ).SerializeToString()


@dataclass
class FakeBackend:
    socket: Path
    versions: frozenset[str] = frozenset({"v1", "v1alpha2"})
    scripts: dict[str, Script] = field(default_factory=dict)
    options: tuple[tuple[str, int], ...] = ()  # more grpc server options (e.g. tiny flow-control windows)
    # Answer as grpc-go (containerd, CRI-O) does, before any handler: a
    # version not served "unknown service S", a method no CRI version has
    # (and no script) "unknown method M for service S". Off: "unknown
    # service PATH", and any method of a served version is a call.
    go_unknown: bool = False
    received: list[Received] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    cancel_seen: asyncio.Event = field(default_factory=asyncio.Event)
    _server: aio.Server | None = None

    def script(self, path: str, **kwargs: Any) -> None:
        self.scripts[path] = Script(**kwargs)

    def calls(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    async def wait_calls(self, path: str, count: int = 1, timeout: float = 5.0) -> list[Received]:
        """Wait until ``count`` calls of ``path`` have arrived."""
        async with asyncio.timeout(timeout), self.arrived:
            await self.arrived.wait_for(lambda: len(self.calls(path)) >= count)
        return self.calls(path)

    async def start(self) -> None:
        big = 64 << 20  # the fake must not be the limit the tests measure
        self._server = aio.server(
            options=[
                ("grpc.max_receive_message_length", big),
                ("grpc.max_send_message_length", big),
                # as containerd (Go grpc): 16 MiB of headers
                ("grpc.max_metadata_size", 16 << 20),
                ("grpc.absolute_max_metadata_size", 16 << 20),
                *self.options,
            ]
        )
        self._server.add_generic_rpc_handlers((_Handler(self),))
        self._server.add_insecure_port(grpc_address(self.socket))
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def __aenter__(self) -> FakeBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _serves(self, path: str) -> bool:
        for version in self.versions:
            if path.startswith(f"/runtime.{version}."):
                return True
        return False

    def _unknown(self, path: str) -> str | None:
        """The UNIMPLEMENTED message for a path not served (None: served)."""
        service, _, method = path.removeprefix("/").rpartition("/")
        if not self._serves(path):
            return f"unknown service {service}" if self.go_unknown else f"unknown service {path}"
        ref = methods.parse_method(path)
        known = ref is not None and path in methods.METHODS.get(ref.version, {})
        if self.go_unknown and path not in self.scripts and not known:
            return f"unknown method {method} for service {service}"
        return None

    async def handle(self, path: str, requests: AsyncIterator[bytes], context: aio.ServicerContext) -> AsyncIterator[bytes]:
        unknown = self._unknown(path)
        if unknown is not None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, unknown)
        held = self.scripts.get(path)
        if held is not None and held.unread and held.code is not None:
            await context.abort(held.code, held.details)
        if held is not None and held.read_after_release:
            held.holding.set()
            await held.release.wait()  # the request's flow-control window fills meanwhile
        collected = [r async for r in requests]
        if not collected and _unary(path):
            # No request message (on the frames path, a hooked call whose
            # stream the proxy reset after a Fail hook refused it): a
            # runtime's unary handler never runs without one (grpc-go waits
            # for the message), so neither is it a call here.
            await context.abort(grpc.StatusCode.INTERNAL, "no request message for a unary method")
        self.received.append(
            Received(path, collected, dict(context.invocation_metadata() or ()), context.time_remaining())
        )
        async with self.arrived:
            self.arrived.notify_all()
        script = self.scripts.get(path)
        if script is None and path.endswith("/Version"):
            script = Script(response=version_response(path.split(".")[1]))
        script = script or Script()
        try:
            if script.initial:
                await context.send_initial_metadata(script.initial)
            if script.hang:
                await script.release.wait()
            if script.delay:
                await asyncio.sleep(script.delay)
            if script.trailing:
                context.set_trailing_metadata(script.trailing)
            if script.code is not None:
                await context.abort(script.code, script.details, script.trailing)
            if script.stream_forever:
                n = 0
                while True:
                    yield n.to_bytes(4, "big")
                    n += 1
                    await asyncio.sleep(0.01)
            if script.stream is not None:
                for message in script.stream:
                    yield message
                return
            yield collected[0] if script.echo and collected else script.response
        except asyncio.CancelledError:
            self.cancelled.append(path)
            self.cancel_seen.set()
            raise


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeBackend) -> None:
        self.fake = fake

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        path = details.method

        async def behaviour(requests: AsyncIterator[bytes], context: aio.ServicerContext) -> AsyncIterator[bytes]:
            async for message in self.fake.handle(path, requests, context):
                yield message

        return grpc.stream_stream_rpc_method_handler(behaviour)


def _unary(path: str) -> bool:
    ref = methods.parse_method(path)
    info = None if ref is None else methods.METHODS.get(ref.version, {}).get(path)
    return info is not None and not (info.client_streaming or info.server_streaming)
