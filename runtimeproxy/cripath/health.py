"""The proxy's gRPC health service: grpcio-health-checking's, whose Watch
calls end at shutdown as the proxy's other streams do.

The stock servicer's Watch loops until the client leaves, so an open Watch
held every stop for the whole grace period (socket-activated clients waiting
in the backlog meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
from grpc_health.v1 import health

SHUTTING_DOWN = "runtime-proxy is shutting down"


class HealthServicer(health.aio.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self._ending = asyncio.Event()

    async def Watch(self, request: Any, context: Any) -> None:  # noqa: N802 - the gRPC method's name
        watch = asyncio.ensure_future(super().Watch(request, context))
        ending = asyncio.ensure_future(self._ending.wait())
        try:
            await asyncio.wait({watch, ending}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        if not watch.cancelled():
            return watch.result()
        await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)

    async def end_watches(self) -> None:
        """Shutdown: every status NOT_SERVING from now on, and Watch calls end (UNAVAILABLE)."""
        await self.enter_graceful_shutdown()
        self._ending.set()
