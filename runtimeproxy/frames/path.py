"""Wiring the frames data path into a Proxy (``--data-path frames``).

The proxy's grpc.aio server moves to a private socket and keeps serving
every call the frames connections divert (hooks, health, refusals); the
proxy's own socket gets the frames listener. So does a socket from systemd,
with no relay in front (cripath/activation.py's is for the grpc path): what
waits in its backlog when the proxy stops stays there for the next instance,
and a connection it accepted gets its server preface and a GOAWAY.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

from grpc import aio

from ..cripath.router import Router
from .connection import Limits
from .listener import FramesListener
from .routes import RouterRoutes


class FramesPath:
    def __init__(self, router: Router, backend: Path, image_backend: Path | None,
                 channel_options: list, limits: Limits) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="runtime-proxy-frames-"))  # 0700: only the proxy
        self.internal = self._dir / "grpc.sock"
        image_apart = image_backend is not None and image_backend != backend
        self.listener = FramesListener(
            Path(), backend, self.internal, RouterRoutes(router, image_apart), channel_options, limits
        )

    async def start(self, server: aio.Server, listen: Path, sock: socket.socket | None = None) -> None:
        """Serve on ``listen``, or on ``sock`` from systemd (from ``start_accepting`` on)."""
        if server.add_insecure_port(f"unix://{self.internal}") == 0:
            raise OSError(f"cannot listen on {self.internal}")
        await server.start()
        self.listener._listen = listen  # noqa: SLF001 - known only at start
        await self.listener.start(sock)

    async def start_accepting(self) -> None:
        await self.listener.start_accepting()

    def stop_accepting(self) -> None:
        self.listener.stop_accepting()

    async def drain(self, grace: float) -> None:
        await self.listener.drain(grace)
        shutil.rmtree(self._dir, ignore_errors=True)
