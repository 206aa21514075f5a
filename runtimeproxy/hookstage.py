"""The hooked path of a CRI call: decode, pre hooks, merge, backend, record, post hooks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from .dispatch import Dispatcher, HookError
from .hookpoints import HOOK_POINTS, HookPoint
from .metrics import Metrics
from .router import Send, Stage, StageProvider
from .store import StateStore

log = logging.getLogger(__name__)


class KeyedLocks:
    """One lock per pod or container id, gone when nobody holds or awaits it.

    Held across the backend call on purpose: calls on the same container are
    applied in the order they arrived, while other containers go in parallel.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock_, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock_, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


class HookStage(StageProvider):
    def __init__(self, dispatcher: Dispatcher, store: StateStore, metrics: Metrics | None = None) -> None:
        self.dispatcher = dispatcher
        self.store = store
        self._metrics = metrics
        self._locks = KeyedLocks()

    def stage_for(self, method: str, client_version: str, backend_version: str) -> Stage | None:
        point = HOOK_POINTS.get(method)
        return None if point is None else functools.partial(self._run, point)

    async def _run(self, point: HookPoint, request: bytes, context: aio.ServicerContext, send: Send) -> bytes:
        started = time.perf_counter()
        outcome = "error"
        try:
            reply = await self._hooked(point, request, context, send)
            outcome = "ok"
            return reply
        finally:
            if self._metrics is not None:
                self._metrics.hooked_call(point.method, outcome, time.perf_counter() - started)

    async def _hooked(self, point: HookPoint, request: bytes, context: aio.ServicerContext, send: Send) -> bytes:
        ex = point.executor
        try:
            req = ex.request.FromString(request)  # the v1 class reads v1alpha2 bytes too
        except DecodeError:
            return await send(request)  # not ours to judge: the backend answers
        key = ex.key(req)
        fields: dict[str, object] = {"method": point.method, "key": key}
        if await ex.skip(req, self.store):
            log.debug("pod opted out of hooks", extra=fields)
            return await send(request)
        async with self._locks.hold(key):
            changed = False
            if point.pre is not None and self.dispatcher.servers(point.pre):
                try:
                    changed = await self.dispatcher.run_pre(
                        point.pre,
                        build=lambda: ex.hook_request(req, self.store),
                        apply=lambda answer: ex.apply(req, answer),
                        log_fields=fields,
                    )
                except HookError as err:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"runtime-proxy: {err}")
            reply = await send(req.SerializeToString() if changed else request)
            response = ex.response.FromString(reply) if ex.reads_response else None
            await ex.record(req, response, self.store)
            if point.post is not None and self.dispatcher.servers(point.post):
                post_request = await ex.hook_request(req, self.store)
                if post_request is not None:
                    await self.dispatcher.run_post(point.post, post_request, fields)
            return reply
