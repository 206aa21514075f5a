"""Whether a hooked call's runtime can be reached, judged before its hooks are asked.

The hooks asked about a call that then fails at the runtime act for nothing
(a PreRunPodSandbox for a pod never made, once per kubelet retry while
containerd restarts). grpc's channel tells what its runtime call would meet:

- READY: sent (the common case: one state read, no await);
- TRANSIENT_FAILURE: failed at once, as grpc fails a call without
  wait-for-ready then. pick_first keeps TRANSIENT_FAILURE through its
  reconnect attempts until a connection is made (gRFC A62; grpcio >= 1.85
  reports no CONNECTING in between), so it holds for the outage's length;
- IDLE (the connection dropped, or unused for grpc's idle timeout) and
  CONNECTING: the call would wait for the connection attempt, made now if
  none is under way. So does the gate, up to the call's deadline: READY
  sends it, TRANSIENT_FAILURE refuses it. An idle channel to a runtime that
  is up is not refused; its call waits for one connection's setup, as it
  would have at the runtime. A call whose deadline comes first ends
  DEADLINE_EXCEEDED, as it would have at the runtime; one with no deadline
  waits at most NO_DEADLINE_WAIT_S, then is refused.

A runtime that listens but does not serve yet (containerd's CRI plugin
loading its state: every call UNKNOWN "server is not initialized yet") is
READY to grpc: ``Unready`` (unready.py) tells the gate, which then refuses
UNAVAILABLE until the runtime is seen to serve.

The gate is asked again before each pre hook of a chain (``RuntimeGate.open``,
via ``runtime_gate``: hookpath/prehooks.py), so a runtime that dies while the
chain runs stops it; the client gets the gate's refusal.

The grpc path's gate (router.py), which the frames path's spliced and
diverted calls reach too (a hooked call is diverted while the runtime is
unready: frames/routes.py); a frames connection's own calls go to its own
runtime connection, better evidence than this channel (its loss cancels the
call's stages: frames/runtimegone.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from .unready import Unready

log = logging.getLogger(__name__)

_S = grpc.ChannelConnectivity
_UNDECIDED = (_S.IDLE, _S.CONNECTING)

# The gate's wait for a call with no deadline (kubelet always sets one). Past
# grpc's own connect timeout (20 s), so a silent runtime's call is refused by
# its attempt's failure; the bound is for a runtime whose connections drop as
# they are made (READY, then IDLE, between two state reads), which would else
# have the gate reconnect for ever.
NO_DEADLINE_WAIT_S = 25.0


class Reach(enum.Enum):
    """What grpc's channel to the runtime came to, for a call waiting on it."""

    READY = "ready"  # connected: the call goes on
    FAILED = "failed"  # the connection attempt failed, or the channel is shut down
    PENDING = "pending"  # still being made when the wait ended


@dataclass(frozen=True)
class Refusal:
    """A hooked call refused before its hooks: its status, and its debug line's error."""

    code: grpc.StatusCode
    message: str
    error: str


def refused(reach: Reach, socket: Path, deadline: bool, asked_some: bool = False) -> Refusal | None:
    """How a call whose channel came to ``reach`` is refused (None: it is not);
    ``deadline``: whether the call has one (its wait ended at it);
    ``asked_some``: refused between its pre hooks, after some were asked."""
    if reach is Reach.READY:
        return None
    asked = "no later hook server of its chain was asked" if asked_some else "no hook server was asked"
    when = "between its pre hooks" if asked_some else "before its hooks"
    if reach is Reach.FAILED:
        return Refusal(grpc.StatusCode.UNAVAILABLE,
                       f"runtime-proxy: the runtime at {socket} is not reachable (its connection failed; the proxy "
                       f"reconnects by itself); the call was not sent and {asked}",
                       f"the runtime is not reachable: refused {when}")
    if deadline:  # as the runtime call would have ended, waiting for the same connection
        return Refusal(grpc.StatusCode.DEADLINE_EXCEEDED,
                       f"runtime-proxy: the connection to the runtime at {socket} was still being made at the "
                       f"call's deadline; the call was not sent and {asked}",
                       f"the runtime's connection was still being made at the call's deadline: refused {when}")
    return Refusal(grpc.StatusCode.UNAVAILABLE,
                   f"runtime-proxy: the connection to the runtime at {socket} was not up within "
                   f"{NO_DEADLINE_WAIT_S:g} s (the call has no deadline); the call was not sent and {asked}",
                   f"the runtime's connection was not up within {NO_DEADLINE_WAIT_S:g} s: refused {when}")


def log_refusal(method: str, socket: Path, refused: Refusal) -> None:
    """A refusal is a debug line, as other calls failing in an outage are: the
    runtime's outage has its own lines (backend.py)."""
    log.debug("call failed", extra={"method": method, "code": refused.code.name, "backend": str(socket),
                                    "error": refused.error})


async def connects(channel: aio.Channel, state: grpc.ChannelConnectivity, limit: float | None,
                   cap: float = NO_DEADLINE_WAIT_S) -> Reach:
    """What ``channel``, in ``state`` (not READY), comes to within ``limit``
    seconds (None: within ``cap``): FAILED at once in TRANSIENT_FAILURE or
    SHUTDOWN, else once the connection attempt it makes (for an idle one,
    from now) succeeds or fails; PENDING if it is still being made then."""
    try:
        async with asyncio.timeout(cap if limit is None else limit):
            if state is _S.IDLE:
                state = channel.get_state(try_to_connect=True)
            while state in _UNDECIDED:
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)
    except TimeoutError:
        return Reach.PENDING
    return Reach.READY if state is _S.READY else Reach.FAILED


class RuntimeGate:
    """The gate of one hooked method on the grpc path: its channel, the
    runtime's socket, and what says whether that runtime serves (an image
    service apart has one that is never told)."""

    __slots__ = ("channel", "_socket", "_path", "unready")

    def __init__(self, channel: aio.Channel, socket: Path, path: str, unready: Unready) -> None:
        self.channel = channel
        self._socket = socket
        self._path = path
        self.unready = unready

    def open(self) -> bool:
        """The common case, a state read and an attribute read: no await."""
        return self.channel.get_state() is _S.READY and self.unready.reason is None

    async def enter(self, context: aio.ServicerContext, between_hooks: bool = False) -> None:
        """The call goes on (returns) once the runtime's connection is up and
        nothing says it does not serve; else it is refused (``context.abort``).
        ``between_hooks``: asked before a later pre hook of the call's chain,
        so its refusal says the hooks before were asked."""
        refusal: Refusal | None = None
        reason = "its connection is not up"  # for the between-hooks line
        state = self.channel.get_state()
        if state is not _S.READY:
            limit = context.time_remaining()
            reach = await connects(self.channel, state, limit)
            refusal = refused(reach, self._socket, deadline=limit is not None, asked_some=between_hooks)
        unready = self.unready
        if refusal is None and unready.reason is not None:
            reason = unready.reason
            when = "between its pre hooks" if between_hooks else "before its hooks"
            refusal = Refusal(grpc.StatusCode.UNAVAILABLE, unready.refusal_text(asked_some=between_hooks),
                              f"the runtime does not serve calls yet ({reason}): refused {when}")
        if refusal is None:
            return
        if between_hooks:
            log.info("the runtime was lost or stopped serving while a hooked call's pre hooks ran: the rest of "
                     "the chain is not asked",
                     extra={"method": self._path, "backend": str(self._socket), "code": refusal.code.name,
                            "reason": reason, "error": refusal.error})
        else:
            log_refusal(self._path, self._socket, refusal)
        await context.abort(refusal.code, refusal.message)


# The gate of the hooked call a task runs (grpc path): asked again before each
# pre hook of its chain (hookpath/prehooks.py). Unset on the frames path, whose
# runtime connection's loss cancels the call's stages itself.
runtime_gate: contextvars.ContextVar[RuntimeGate | None] = contextvars.ContextVar(
    "runtimeproxy_runtime_gate", default=None
)
