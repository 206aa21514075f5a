"""The NRI plugin side of one runtime connection: register, serve the Plugin
service, and hand events to an :class:`EventHandler`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import Message

from cri_api.nri import api_pb2 as nri

from . import ttrpc
from .mux import PLUGIN_CONN, RUNTIME_CONN, Mux

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTRATION_TIMEOUT = 5.0  # containerd's plugin_registration_timeout default


def event_mask(events: Sequence[int]) -> int:
    """ConfigureResponse.events: bit ``1 << (event - 1)`` per event."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class EventHandler(Protocol):
    """What a plugin does with the runtime's requests."""

    def events(self) -> Sequence[int]: ...

    async def synchronize(self, pods: Sequence[nri.PodSandbox], containers: Sequence[nri.Container]) -> None: ...

    async def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.ContainerAdjustment: ...

    async def update_container(
        self, pod: nri.PodSandbox, container: nri.Container, resources: nri.LinuxResources
    ) -> list[nri.ContainerUpdate]: ...

    async def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> None: ...

    async def state_change(self, event: nri.StateChangeEvent) -> None: ...

    def disconnected(self) -> None: ...


@dataclass(frozen=True)
class Identity:
    name: str
    index: str  # two digits: plugins are called in index order

    def __post_init__(self) -> None:
        if len(self.index) != 2 or not self.index.isdigit():
            raise ValueError(f"NRI plugin index must be two digits (00-99), not {self.index!r}")


class PluginConnection:
    """One connection to the runtime, from registration until it closes."""

    def __init__(self, identity: Identity, handler: EventHandler) -> None:
        self.identity = identity
        self.handler = handler
        self.configured = asyncio.Event()
        self.synchronized = asyncio.Event()

    def _handlers(self) -> dict[tuple[str, str], ttrpc.Handler]:
        def method(name: str, request_type: type[Message], call: object) -> tuple[tuple[str, str], ttrpc.Handler]:
            async def handle(payload: bytes) -> bytes:
                answer = await call(request_type.FromString(payload))  # type: ignore[operator]  # call: a handler for request_type (object: they differ)
                return answer.SerializeToString()

            return (PLUGIN_SERVICE, name), handle

        return dict(
            (
                method("Configure", nri.ConfigureRequest, self._configure),
                method("Synchronize", nri.SynchronizeRequest, self._synchronize),
                method("Shutdown", nri.Empty, self._shutdown),
                method("CreateContainer", nri.CreateContainerRequest, self._create),
                method("UpdateContainer", nri.UpdateContainerRequest, self._update),
                method("StopContainer", nri.StopContainerRequest, self._stop),
                method("StateChange", nri.StateChangeEvent, self._state_change),
            )
        )

    async def _configure(self, req: nri.ConfigureRequest) -> nri.ConfigureResponse:
        mask = event_mask(self.handler.events())
        log.info(
            "configured by the runtime",
            extra={"runtime": req.runtime_name, "runtime_version": req.runtime_version, "events": mask},
        )
        self.configured.set()
        return nri.ConfigureResponse(events=mask)

    async def _synchronize(self, req: nri.SynchronizeRequest) -> nri.SynchronizeResponse:
        await self.handler.synchronize(req.pods, req.containers)
        log.info("synchronized with the runtime", extra={"pods": len(req.pods), "containers": len(req.containers)})
        self.synchronized.set()
        return nri.SynchronizeResponse()

    async def _shutdown(self, req: nri.Empty) -> nri.Empty:
        log.info("runtime asked the plugin to shut down")
        return nri.Empty()

    async def _create(self, req: nri.CreateContainerRequest) -> nri.CreateContainerResponse:
        return nri.CreateContainerResponse(adjust=await self.handler.create_container(req.pod, req.container))

    async def _update(self, req: nri.UpdateContainerRequest) -> nri.UpdateContainerResponse:
        updates = await self.handler.update_container(req.pod, req.container, req.linux_resources)
        return nri.UpdateContainerResponse(update=updates)

    async def _stop(self, req: nri.StopContainerRequest) -> nri.StopContainerResponse:
        await self.handler.stop_container(req.pod, req.container)
        return nri.StopContainerResponse()

    async def _state_change(self, req: nri.StateChangeEvent) -> nri.Empty:
        await self.handler.state_change(req)
        return nri.Empty()

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Register and serve until the runtime closes the connection.

        Raises when registration fails; returns when the connection ends."""
        mux = Mux(reader, writer)
        server = ttrpc.Server(mux.open(PLUGIN_CONN), self._handlers())
        client = ttrpc.Client(mux.open(RUNTIME_CONN))
        tasks = [
            asyncio.create_task(mux.run(), name="nri-mux"),
            asyncio.create_task(server.serve(), name="nri-plugin-service"),
            asyncio.create_task(client.run(), name="nri-runtime-client"),
        ]
        try:
            await client.call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                nri.RegisterPluginRequest(plugin_name=self.identity.name, plugin_idx=self.identity.index),
                nri.Empty,
                REGISTRATION_TIMEOUT,
            )
            log.info("registered with the runtime", extra={"plugin": self.identity.name, "index": self.identity.index})
            # Each of them runs until the socket ends; one that stops early
            # (a broken frame) ends the connection too.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            errors = [repr(task.exception()) for task in done if not task.cancelled() and task.exception()]
            log.warning("runtime closed the NRI connection", extra={"errors": errors} if errors else {})
        finally:
            mux.close()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.handler.disconnected()
