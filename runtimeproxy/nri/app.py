"""Assembling the NRI plugin: the proxy's hook path behind an NRI connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential,
)

from ..hookpath.nodefacts import NodeFactsSource
from ..hookpath.parentcpuset import ParentCpusets
from ..hookpath.registry import HookRegistry
from ..hookpath.stage import HookStage
from ..hookpath.store import StateStore
from ..hookpath.validate import NodeFactsReader
from ..metrics import Metrics
from .adapter import ANSWER_MARGIN, HookAdapter
from .limits import ClampedRegistry, ObservingDispatcher, order_wait
from .plugin import Identity, PluginConnection
from .ttrpc import TtrpcError

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/run/nri/nri.sock")
DEFAULT_NAME = "runtime-proxy"
DEFAULT_INDEX = "50"
DEFAULT_REQUEST_TIMEOUT = 2.0  # containerd's plugin_request_timeout default


@dataclass(frozen=True)
class NriSettings:
    hook_dir: Path
    socket_path: Path = DEFAULT_SOCKET
    name: str = DEFAULT_NAME
    index: str = DEFAULT_INDEX
    socket_fd: int | None = None  # a connection the runtime made for us (NRI_PLUGIN_SOCKET)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_backoff: float = 5.0
    metrics_listen: str | None = None

    @property
    def budget(self) -> float:
        return max(self.request_timeout - ANSWER_MARGIN, 0.1)

    @classmethod
    def from_environment(cls, settings: NriSettings, environ: dict[str, str] | None = None) -> NriSettings:
        """Started by the runtime: the pre-connected socket, name and index it gave us win."""
        env = os.environ if environ is None else environ
        fd = env.get("NRI_PLUGIN_SOCKET")
        if not fd:
            return settings
        return NriSettings(
            **{
                **settings.__dict__,
                "socket_fd": int(fd),
                "name": env.get("NRI_PLUGIN_NAME") or settings.name,
                "index": env.get("NRI_PLUGIN_IDX") or settings.index,
            }
        )


class NriPlugin:
    """The hook path and the runtime connection(s) it serves."""

    def __init__(self, settings: NriSettings) -> None:
        self.settings = settings
        self.identity = Identity(settings.name, settings.index)
        self.metrics = Metrics()
        self.registry = HookRegistry(settings.hook_dir)
        self.registry.on_change(lambda snapshot: self.metrics.hook_servers.set(len(snapshot)))
        self.registry.reload()
        clamped = ClampedRegistry(self.registry, settings.budget)
        node = NodeFactsSource(NodeFactsReader(), parents=ParentCpusets.of_host())
        self.dispatcher = ObservingDispatcher(clamped, self.metrics, node=node)
        self.store = StateStore()
        self.stage = HookStage(self.dispatcher, self.store, self.metrics, order_wait=order_wait(clamped), carries=False)
        self.adapter = HookAdapter(self.stage, self.store, settings.budget)
        self.connection: PluginConnection | None = None
        self.connected = asyncio.Event()  # set while a connection is synchronized

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``, or (pre-connected) until the runtime leaves."""
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.dispatcher.close)
            stack.push_async_callback(self.adapter.close)
            watch_stop = asyncio.Event()
            watch = asyncio.create_task(self.registry.watch(watch_stop), name="hook-dir-watch")
            serving = asyncio.create_task(self._serve(stack), name="nri-connection")
            stopped = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch_stop.set()
                for task in (serving, stopped, watch):
                    task.cancel()
                await asyncio.gather(serving, stopped, watch, return_exceptions=True)
            if serving.done() and not serving.cancelled() and serving.exception() is not None:
                raise serving.exception()  # type: ignore[misc]  # not None: checked above (a call mypy does not narrow)

    async def _serve(self, stack: contextlib.AsyncExitStack) -> None:
        if self.settings.metrics_listen:  # in this task: a stop ends the wait for its host's lookup at once
            await self.metrics.serve(self.settings.metrics_listen, stack)
        if self.settings.socket_fd is not None:
            sock = socket.socket(fileno=self.settings.socket_fd)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            await self._session(reader, writer)
            log.info("the runtime that started this plugin closed its connection; exiting")
            return
        while True:
            reader, writer = await self._connect()
            try:
                synchronized = await self._session(reader, writer)
            except (TtrpcError, ConnectionError, OSError) as exc:
                log.warning("NRI registration failed", extra={"error": str(exc)})
                synchronized = False
            if not synchronized:
                await asyncio.sleep(self.settings.max_backoff)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One connection; whether the runtime got as far as synchronizing."""
        connection = self.connection = PluginConnection(self.identity, self.adapter)
        watch = asyncio.create_task(self._note_synchronized(connection))
        try:
            await connection.run(reader, writer)
        finally:
            watch.cancel()
            self.connected.clear()
        return connection.synchronized.is_set()

    async def _note_synchronized(self, connection: PluginConnection) -> None:
        await connection.synchronized.wait()
        self.connected.set()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        path = self.settings.socket_path

        def note(state: RetryCallState) -> None:
            outcome = state.outcome
            error = outcome.exception() if outcome is not None else None
            log.info(
                "NRI socket not reachable yet, retrying",
                extra={"socket": str(path), "attempt": state.attempt_number, "error": str(error)},
            )

        async for attempt in AsyncRetrying(
            wait=wait_exponential(multiplier=0.05, max=self.settings.max_backoff),
            retry=retry_if_exception_type(OSError),
            before_sleep=note,
            reraise=True,
        ):
            with attempt:
                reader, writer = await asyncio.open_unix_connection(str(path))
                log.info("connected to the runtime's NRI socket", extra={"socket": str(path)})
                return reader, writer
        raise AssertionError("unreachable: tenacity retries until it connects")
