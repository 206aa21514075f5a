"""The running hook's answer to ``runtime-proxy hook balloons status``.

A unix socket next to the hook socket (``NAME.sock`` -> ``NAME.status.sock``)
that writes the current balloons as one JSON document to whoever connects,
then closes. Chosen over a status file the hook rewrites: the answer is the
live in-memory state at the moment of asking, and no answer means no hook is
running (a file would outlive a dead hook and look current). It reads nothing
from the client, so there is nothing to parse or abuse; mode 0660 like the
hook socket.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hooks.sdk import HookServerError
from runtimeproxy.host import socketlock, unixsocket  # the same socket rules as the hook socket
from runtimeproxy.host.acceptor import bound_socket

from .pool import Pool
from .topology import format_cpuset

log = logging.getLogger(__name__)


def balloons_snapshot(pool: Pool) -> list[dict[str, object]]:
    """Each balloon as the status shows it: its own and effective CPUs, memory nodes, containers."""
    return [
        {
            "name": balloon.name,
            "type": balloon.btype.name,
            "cpus": format_cpuset(balloon.cpus),
            "effective_cpus": format_cpuset(pool.effective_cpus(balloon)),
            "mems": format_cpuset(pool.effective_mems(balloon)),
            "requested_milli_cpus": balloon.requested_milli,
            "containers": [
                {"name": m.label, "id": m.container_id, "milli_cpus": m.milli}
                for m in sorted(balloon.members.values(), key=lambda m: m.label)
            ],
        }
        for balloon in pool.balloons
    ]


def status_socket_for(hook_socket: str | os.PathLike[str]) -> Path:
    path = Path(hook_socket)
    return path.with_name(f"{path.name.removesuffix('.sock')}.status.sock")


class StatusServer:
    def __init__(self, path: Path, snapshot: Callable[[], dict[str, Any]], mode: int = 0o660) -> None:
        self.path = path
        self._snapshot = snapshot
        self._mode = mode
        self._server: asyncio.AbstractServer | None = None
        self._identity: unixsocket.SocketIdentity | None = None
        self._path_lock: socketlock.SocketLock | None = None

    async def start(self) -> None:
        try:
            # Locked as the hook socket is, from before its stale check until its stop is over.
            self._path_lock = await socketlock.claim(self.path)
        except unixsocket.UnixSocketError as exc:
            raise HookServerError(str(exc)) from exc
        try:
            # Bound here, under the socket umask (never briefly wider than 0660),
            # its identity kept at once and the server set before it serves: a
            # cancel at its one await (a stop signal while hook run starts)
            # finds a server for stop to close and a socket it may remove.
            sock = bound_socket(str(self.path))
            try:
                self._identity = unixsocket.SocketIdentity.of(self.path)
                os.chmod(self.path, self._mode)
                self._server = await asyncio.start_unix_server(self._answer, sock=sock, start_serving=False)
            except BaseException:
                sock.close()
                raise
            await self._server.start_serving()
        except BaseException:
            await self.stop()
            raise

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write((json.dumps(self._snapshot(), indent=2) + "\n").encode())
            await writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("status client left early", extra={"error": str(exc)})
        finally:
            writer.close()

    async def stop(self) -> None:
        server, self._server = self._server, None
        try:
            if server is not None:
                server.close()
                await server.wait_closed()
        finally:  # a stop that failed or was cut short too: neither the socket nor the lock outlives it
            unixsocket.remove_own(self.path, self._identity)
            self._identity = None
            socketlock.release(self._path_lock)


async def read_status(path: Path, timeout: float = 5.0) -> dict[str, Any]:
    async def read() -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(path))
        try:
            return await reader.read()
        finally:
            writer.close()

    return json.loads(await asyncio.wait_for(read(), timeout))


def render(doc: dict[str, Any]) -> str:
    """The status as an operator reads it."""
    lines = [f"reserved cpus {doc['reserved_cpus']}, free cpus {doc['free_cpus'] or '-'}, ready: {doc['ready']}"]
    if doc.get("topology_problem"):
        lines.append(f"cpus online {doc['online_cpus']}; balloons stay as planned before: {doc['topology_problem']}")
    for balloon in doc["balloons"]:
        lines.append(
            f'{balloon["name"]}{{cpus:"{balloon["effective_cpus"]}", mems:"{balloon["mems"]}"}} '
            f"owns {balloon['cpus'] or '-'}, requested {balloon['requested_milli_cpus']}m"
        )
        for container in balloon["containers"]:
            ident = container["id"][:13] or "(not started)"
            lines.append(f"  {container['name']}  {ident}  {container['milli_cpus']}m")
    return "\n".join(lines)
