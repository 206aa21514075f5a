"""What built-in hooks share to talk to the runtime over CRI v1: the
``runtimeEndpoint`` setting (usually the proxy's own socket), one channel per
endpoint, and the verbose status containerd answers with.

balloons (:mod:`hooks.balloons.runtime`) and batchresource
(:mod:`hooks.batchresource.runtime`) each subclass :class:`CriClient` with the
calls of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.config import EndpointURLError, endpoint_path
from runtimeproxy.hookpath.executorbase import SKIP_LABEL
from runtimeproxy.hookpath.store import verbose_info
from runtimeproxy.host.unixsocket import dial_problem, grpc_target
from runtimeproxy.shown import shown

__all__ = [
    "DEFAULT_RUNTIME_ENDPOINT",
    "LIVE_STATES",
    "SKIP_LABEL",
    "ClientClosed",
    "Connection",
    "CriClient",
    "EndpointChanged",
    "endpoint_socket",
    "skips_hooks",
    "verbose_info",  # (runtimeproxy.hookpath.store's, which reads the same statuses)
]

# The proxy's own socket (its systemd unit's --listen): a call sent there
# passes through the proxy's hooks like kubelet's.
DEFAULT_RUNTIME_ENDPOINT = "/var/run/runtime-proxy/runtime-proxy.sock"
LIVE_STATES = (v1.CONTAINER_CREATED, v1.CONTAINER_RUNNING)


def skips_hooks(labels: Any) -> bool:
    """A pod the proxy never hooks (the label the proxy's executor goes by)."""
    return str(labels.get(SKIP_LABEL, "")).lower() == "true"


def endpoint_socket(value: Any, key: str = "runtimeEndpoint") -> str:
    """A runtime endpoint setting (``key`` in the hook's config) as the
    absolute path it names: a path, or an endpoint URL as kubelet takes it
    (unix:///run/x.sock, unix:/run/x.sock, any case). ValueError, naming the
    key and the value, for anything else."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ValueError(f"{key}: expected a socket path, got {shown(value)}")
    try:
        path = endpoint_path(value)
    except EndpointURLError as exc:
        raise ValueError(f"{key} {shown(value)}: {exc}") from None
    if not path.startswith("/"):  # relative to wherever the hook runs (/ under systemd)
        raise ValueError(f"{key} {shown(value)}: expected an absolute socket path (/PATH or unix:///PATH)")
    if (problem := dial_problem(path)) is not None:  # the hook dials it
        raise ValueError(f"{key} {shown(value)}: {problem}")
    return path


class EndpointChanged(Exception):
    """A reload changed runtimeEndpoint during a listing or a move. The calls
    made so far went to the old endpoint; the rest are not sent to the new
    one: a listing would pair one runtime's pods with another's containers, a
    move carry one's resources to the other."""


class ClientClosed(Exception):
    """The hook closed the client (it is stopping): no call is sent, and no
    channel opened again (it would never be closed)."""


@dataclass(frozen=True)
class Connection:
    """One endpoint's channel; every call of one listing or move goes through one."""

    endpoint: str
    channel: aio.Channel
    stub: v1_grpc.RuntimeServiceStub


class CriClient:
    """A lazily opened channel to ``endpoint``, retargeted by a reload, closed at stop (reopened only
    by the start again of a hook whose start failed: :meth:`reopen`)."""

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._connection: Connection | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """close() was called: a call it cancelled is the hook stopping, not a failure."""
        return self._closed

    def _connect(self) -> Connection:
        if self._closed:
            raise ClientClosed(f"the client of {self.endpoint} is closed")
        if self._connection is None:
            channel = aio.insecure_channel(grpc_target(self.endpoint))
            self._connection = Connection(self.endpoint, channel, self._new_stub(channel))
        return self._connection

    def _new_stub(self, channel: aio.Channel) -> v1_grpc.RuntimeServiceStub:
        return v1_grpc.RuntimeServiceStub(channel)  # (tests answer with a stub of their own)

    def _on(self, connection: Connection) -> v1_grpc.RuntimeServiceStub:
        """``connection``'s stub while it is the client's; EndpointChanged once
        retargeted, ClientClosed once closed."""
        if connection is not self._connection:
            if self._closed:
                raise ClientClosed(f"the client of {connection.endpoint} was closed")
            raise EndpointChanged(f"runtimeEndpoint changed from {connection.endpoint} to {self.endpoint}")
        return connection.stub

    async def retarget(self, endpoint: str) -> None:
        """Talk to ``endpoint`` from the next listing or move on (a reloaded config's)."""
        self.endpoint = endpoint
        await self._drop()

    async def close(self) -> None:
        """The hook stops: every call from now on raises ClientClosed (until :meth:`reopen`)."""
        self._closed = True
        await self._drop()

    def reopen(self) -> None:
        """Usable again after :meth:`close`: a start that failed closed it
        in its release step, and the next start, under the socket's lock
        again, reopens it. The next call opens a new channel."""
        self._closed = False

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.channel.close()
