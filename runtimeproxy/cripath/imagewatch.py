"""An image service on a socket of its own (``--image-backend``): whether it
can be reached, and its outages.

The runtime is probed (backend.py); a separate image service serves only the
image calls (kubelet's pulls, its image garbage collection), which fail
UNAVAILABLE while it is away. Health and ``runtime_proxy_backend_ready``
saying nothing of it would tell an operator all is well while no pod whose
image is missing can start.

It is judged by its channel, kept connected as the runtime's is (each look
asks grpc to connect): TRANSIENT_FAILURE (a connection attempt failed:
nothing listens, or the socket is gone) begins an outage, READY ends it.
IDLE and CONNECTING decide nothing: grpc's idle timeout closes an unused
connection, and the next look reconnects it. No CRI call is made:
ImageService has no Version, and a process that takes the connection on that
socket is the image service. pick_first keeps TRANSIENT_FAILURE through its
reconnect attempts (unreachable.py), so an outage has its two ends and no
count of failed attempts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc import aio

from ..outages import IMAGE_BACKEND, OutageLog

log = logging.getLogger(__name__)

_S = grpc.ChannelConnectivity


class ImageWatch:
    """The separate image service's reachability: ``up``, and its listeners
    told True when it comes (back), False when it is lost."""

    def __init__(self, socket: Path, channel: aio.Channel, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self._channel = channel
        self.up = False  # connected now: READY seen, no failed attempt since
        self._was_up = False  # connected at some time since start (its end line says "again")
        self._outages = OutageLog(log, IMAGE_BACKEND, clock=clock)
        self._listeners: list[Callable[[bool], None]] = []

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """Called with True when the image service comes (back), False when it is lost."""
        self._listeners.append(listener)

    async def run(self) -> None:
        """Look at each state the channel comes to, until cancelled (the
        proxy's stop, before the channel closes: supervisor.STOP_ORDER)."""
        state = self._channel.get_state(try_to_connect=True)
        while True:
            self._seen(state)
            await self._channel.wait_for_state_change(state)
            state = self._channel.get_state(try_to_connect=True)

    def _seen(self, state: grpc.ChannelConnectivity) -> None:
        name = str(self.socket)
        fields = {"backend": name}
        if state is _S.READY:
            if self.up:
                return
            self.up = True
            if self._outages.down(name):
                self._outages.succeeded(name, fields, first=not self._was_up)
            else:
                log.info("image backend connected", extra=fields)
            self._was_up = True
            self._tell(True)
        elif state is _S.TRANSIENT_FAILURE:
            if not self.up and self._outages.down(name):
                return  # the outage under way
            self.up = False
            # The outage starts at the loss (or, at start, at the first failed
            # attempt): this line pairs with its end.
            self._outages.began(
                name, logging.WARNING, "image backend unavailable" if self._was_up else "image backend not reachable yet",
                {**fields, "reason": "connection failed"})
            self._tell(False)

    def _tell(self, up: bool) -> None:
        """One listener's failure is its own: the others (health, the metric) still hear it."""
        for listener in self._listeners:
            try:
                listener(up)
            except Exception:
                log.exception("image backend listener failed",
                              extra={"backend": str(self.socket), "up": up, "listener": repr(listener)})
