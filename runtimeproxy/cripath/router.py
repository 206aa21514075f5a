"""Which handler serves each incoming method path.

One immutable table, rebuilt whenever the backend's versions change, maps
every known CRI path to a handler: relay as raw bytes, relay through a chain
of stages (hooks, version checks) for the few methods that need decoding, or
refuse with a status that says why. Paths the table does not know (a newer
kubelet's methods) are relayed as bidirectional byte streams, which carry any
cardinality on the wire.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import grpc
from grpc import aio

from . import methods, unreachable
from .backend import CRI_VERSIONS, Backend, BackendInfo
from .callstats import CallSink, measured
from .forward import Relay
from .stage import Stage, StageProvider, Unary, compose
from .unready import Unready
from .versions import VersionPlan, VersionPlanError, plan

log = logging.getLogger(__name__)

REFUSAL_READ_S = 1.0  # a refused client that never half-closes is answered after this


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    # A stream-stream handler answers a call of any cardinality.
    async def refuse(requests: Any, context: aio.ServicerContext):
        # Read what the client sends (bounded) before answering: a grpc.aio
        # client still writing its request when the status arrives reports
        # INTERNAL "Internal error from Core" instead of it (grpc#36066).
        try:
            async with asyncio.timeout(REFUSAL_READ_S):
                async for _ in requests:
                    pass
        except (TimeoutError, aio.AioRpcError):
            pass
        log.info("call refused", extra={"code": code.name, "error": message})
        await context.abort(code, message)
        yield b""  # pragma: no cover - makes this an async generator

    return grpc.stream_stream_rpc_method_handler(refuse)


class HeldCalls:
    """Calls that come in while the proxy stops: held, then (once the server
    has begun its shutdown, see Proxy.stop) answered UNAVAILABLE, or, with
    ``serve``, served: with socket activation nothing is refused, since
    kubelet's next connection waits in the backlog for the next instance."""

    def __init__(self, serve: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None] | None = None) -> None:
        self.count = 0
        self._released = asyncio.Event()
        self._serve = serve

        async def hold(requests: Any, context: aio.ServicerContext):
            await self._released.wait()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime-proxy is shutting down")
            yield b""  # pragma: no cover - makes this an async generator

        self.handler = grpc.stream_stream_rpc_method_handler(hold)

    def take(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        self.count += 1
        if self._serve is None:
            return self.handler
        handler = self._serve(details)
        return None if handler is None else _after(self._released, handler)

    async def until_quiet(self, quiet: float, limit: float, activity: Callable[[], int | None] = lambda: 0) -> None:
        """Until no call came in for ``quiet`` seconds (at most ``limit``), and
        ``activity`` (a mark that changes with what else goes on; None: not
        quiet) stayed the same."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            seen, before = self.count, activity()
            await asyncio.sleep(quiet)
            after = activity()
            if (self.count == seen and after is not None and after == before) or loop.time() >= deadline:
                return

    def release(self) -> None:
        self._released.set()


class Router(grpc.GenericRpcHandler):
    def __init__(
        self,
        backend: Backend,
        relay: Relay,
        serve_versions: str = "auto",
        backend_version: str | None = None,
        stages: Sequence[StageProvider] = (),
        calls: CallSink | None = None,
    ) -> None:
        self._backend = backend
        self._calls = calls
        self._relay = relay
        self._serve_versions = serve_versions
        self._backend_version = backend_version
        self._stages = tuple(stages)
        self.plan: VersionPlan | None = None
        unavailable = _refusal(grpc.StatusCode.UNAVAILABLE, "runtime-proxy: backend runtime not reachable yet")
        self._table: Mapping[str, grpc.RpcMethodHandler] = MappingProxyType({})
        self._fallback: Callable[[methods.MethodRef], grpc.RpcMethodHandler] = lambda ref: self._measure(ref, unavailable)
        self._held: HeldCalls | None = None
        backend.on_change(self.rebuild)

    @property
    def stages(self) -> tuple[StageProvider, ...]:
        return self._stages

    @property
    def calls(self) -> CallSink | None:
        return self._calls

    @property
    def unready(self) -> Unready:
        """Whether the runtime is known not to serve yet (unready.py)."""
        return self._backend.unready

    def runtime_unimplemented(self) -> None:
        """A call the frames path relayed got UNIMPLEMENTED from the runtime (Backend.probe_soon)."""
        self._backend.probe_soon()

    # grpc calls this for every incoming call; keep it a dict lookup.
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if self._held is not None:
            return self._held.take(handler_call_details)
        return self._lookup(handler_call_details)

    def _lookup(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        handler = self._table.get(method)
        if handler is not None:
            return handler
        ref = methods.parse_method(method)
        if ref is None:
            return None  # not CRI: grpc answers UNIMPLEMENTED
        return self._fallback(ref)

    def hold_new_calls(self, serve: bool = False) -> HeldCalls:
        """Shutdown: every call from now on is held (see HeldCalls)."""
        self._held = HeldCalls(self._lookup if serve else None)
        return self._held

    def rebuild(self, info: BackendInfo) -> None:
        try:
            new_plan = plan(info.versions, self._serve_versions, self._backend_version)
        except VersionPlanError as exc:
            log.error("cannot serve this backend", extra={"error": str(exc), "runtime": info.describe()})
            message = f"runtime-proxy: {exc}"
            refusal = _refusal(grpc.StatusCode.FAILED_PRECONDITION, message)
            self._table, self.plan = MappingProxyType({}), None
            self._fallback = lambda ref: self._measure(ref, refusal)
            return
        table: dict[str, grpc.RpcMethodHandler] = {}
        for version in CRI_VERSIONS:
            for path, info_ in methods.METHODS[version].items():
                ref = methods.parse_method(path)
                assert ref is not None  # the table's own paths
                table[path] = self._measure(ref, self._handler(ref, info_, new_plan, info))
        self._table = MappingProxyType(table)
        self._fallback = lambda ref: self._measure(ref, self._unknown(ref, new_plan, info))
        if new_plan != self.plan:
            log.info(new_plan.describe(), extra={"runtime": info.describe()})
        self.plan = new_plan

    def _measure(self, ref: methods.MethodRef, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        # Wrapped once per table entry; calls the table does not know are
        # wrapped per call (rare: a newer client's methods, or no backend yet).
        return handler if self._calls is None else measured(handler, ref, self._calls)

    def _unknown(self, ref: methods.MethodRef, p: VersionPlan, info: BackendInfo) -> grpc.RpcMethodHandler:
        target = p.routes.get(ref.version)
        if target is None:
            return self._not_served(ref, info)
        return self._stream_stream(self._backend.channel_for(ref.service), ref.in_version(target).path)

    def _stream_stream(self, channel: aio.Channel, path: str) -> grpc.RpcMethodHandler:
        relay = self._relay

        async def stream_stream(requests: Any, context: aio.ServicerContext):
            async for message in relay.stream_stream(channel, path, requests, context):
                yield message

        return grpc.stream_stream_rpc_method_handler(stream_stream)

    def _not_served(self, ref: methods.MethodRef, info: BackendInfo) -> grpc.RpcMethodHandler:
        return _refusal(
            grpc.StatusCode.UNIMPLEMENTED,
            f"runtime-proxy does not serve CRI {ref.version} (method {ref.path}); "
            f"the backend {info.runtime_name} {info.runtime_version} serves {', '.join(sorted(info.versions))}",
        )

    def _handler(
        self, ref: methods.MethodRef, method: methods.MethodInfo, vplan: VersionPlan, info: BackendInfo
    ) -> grpc.RpcMethodHandler:
        target = vplan.routes.get(ref.version)
        if target is None:
            return self._not_served(ref, info)
        backend_ref = ref.in_version(target)
        if backend_ref.path not in methods.METHODS[target]:
            return _refusal(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{ref.service}/{ref.method} does not exist in CRI {target}, "
                f"the version runtime-proxy speaks to the backend {info.runtime_name} {info.runtime_version}",
            )
        channel = self._backend.channel_for(ref.service)
        path = backend_ref.path
        relay = self._relay
        if method.client_streaming:
            return self._stream_stream(channel, path)
        if method.server_streaming:
            async def server_stream(requests: AsyncIterator[bytes], context: aio.ServicerContext):
                request = await _only_request(requests, context, "server-streaming")
                async for message in relay.server_stream(channel, path, request, context):
                    yield message

            return grpc.stream_stream_rpc_method_handler(server_stream)

        stages = [
            stage
            for stage in (provider.stage_for(ref.method, ref.version, target) for provider in self._stages)
            if stage is not None
        ]
        if not stages:
            async def unary(request: bytes, context: aio.ServicerContext) -> bytes:
                return await relay.unary(channel, path, request, context)

            return _one_request(unary)
        backend = self._backend
        if ref.service == "ImageService" and backend.image_socket != backend.runtime_socket:
            gate = unreachable.RuntimeGate(channel, backend.image_socket, path, Unready(backend.image_socket))
        else:
            gate = unreachable.RuntimeGate(channel, backend.runtime_socket, path, backend.unready)
        return _one_request(_unless_unreachable(gate, _chain(stages, relay, channel, path)))


async def _only_request(requests: AsyncIterator[bytes], context: aio.ServicerContext, kind: str) -> bytes:
    """The one request message of a call whose client does not stream.

    grpc.aio's unary (and server-streaming) handler takes the first of two
    request messages and waits for a missing one until the client's
    deadline; grpc-go (containerd, kubelet's runtimes) and grpc-java answer
    either INTERNAL, before the method runs. So does this, as the frames
    path does (divert.py, hooked.py). What this costs over a unary-unary
    handler (a tenth of a relayed call's time) is the read of the request's
    end, one more grpc core batch: a unary-unary handler cannot do without
    it, as grpc.aio never runs one for a call with no message, and reading
    with ``context.read()`` saves under a microsecond (docs/performance.md).
    """
    request: bytes | None = None
    async for message in requests:
        if request is not None:  # no need to read on: the call is refused
            await context.abort(grpc.StatusCode.INTERNAL, f"more than one request message for a {kind} call")
        request = message
    if request is None:
        await context.abort(grpc.StatusCode.INTERNAL, f"0 request messages for a {kind} call")
    return request  # type: ignore[return-value]  # not None: abort raises (grpc has no stubs to say so)


def _one_request(unary: Unary) -> grpc.RpcMethodHandler:
    """A unary method's handler that reads the request stream itself (``_only_request``)."""

    async def handle(requests: AsyncIterator[bytes], context: aio.ServicerContext) -> bytes:
        return await unary(await _only_request(requests, context, "unary"), context)

    return grpc.stream_unary_rpc_method_handler(handle)


def _after(event: asyncio.Event, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` (one the router makes: stream-unary or stream-stream), starting once ``event`` is set."""
    single = handler.stream_unary
    if single is not None:
        async def later(requests: Any, context: aio.ServicerContext) -> Any:
            await event.wait()
            return await single(requests, context)

        return grpc.stream_unary_rpc_method_handler(later)

    inner = handler.stream_stream

    async def later_stream(requests: Any, context: aio.ServicerContext):
        await event.wait()
        async for message in inner(requests, context):
            yield message

    return grpc.stream_stream_rpc_method_handler(later_stream)


def _unless_unreachable(gate: unreachable.RuntimeGate, unary: Unary) -> Unary:
    """``unary``, a call with stages, refused before any stage runs unless
    ``gate`` finds the runtime reachable and serving (unreachable.py):
    UNAVAILABLE if its connection fails or it does not serve yet,
    DEADLINE_EXCEEDED if its connection is still being made at the call's
    deadline. The hooks asked first would act for nothing (a PreRunPodSandbox
    for a pod never made, once per kubelet retry). The gate is asked again
    before each pre hook (``runtime_gate``). READY, the common case, costs a
    state read and an attribute read, inline."""
    current = unreachable.runtime_gate
    state = gate.channel.get_state
    unready = gate.unready
    ready = grpc.ChannelConnectivity.READY

    async def handle(request: bytes, context: aio.ServicerContext) -> bytes:
        if state() is not ready or unready.reason is not None:
            await gate.enter(context)
        token = current.set(gate)
        try:
            return await unary(request, context)
        finally:
            current.reset(token)

    return handle


def _chain(stages: list[Stage], relay: Relay, channel: aio.Channel, path: str) -> Callable[..., Awaitable[bytes]]:
    """Compose stages once, at table build time, into one unary behaviour."""

    async def backend(request: bytes, context: aio.ServicerContext) -> bytes:
        return await relay.unary(channel, path, request, context)

    return compose(stages, backend)
