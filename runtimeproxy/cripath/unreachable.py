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

The grpc path's gate (router.py), which the frames path's spliced
connections reach too; a frames connection's own calls go to its own
runtime connection, better evidence than this channel.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

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


def refused(reach: Reach, socket: Path, deadline: bool) -> Refusal | None:
    """How a call whose channel came to ``reach`` is refused (None: it is not);
    ``deadline``: whether the call has one (its wait ended at it)."""
    if reach is Reach.READY:
        return None
    if reach is Reach.FAILED:
        return Refusal(grpc.StatusCode.UNAVAILABLE,
                       f"runtime-proxy: the runtime at {socket} is not reachable (its connection failed; the proxy "
                       "reconnects by itself); the call was not sent and no hook server was asked",
                       "the runtime is not reachable: refused before its hooks")
    if deadline:  # as the runtime call would have ended, waiting for the same connection
        return Refusal(grpc.StatusCode.DEADLINE_EXCEEDED,
                       f"runtime-proxy: the connection to the runtime at {socket} was still being made at the "
                       "call's deadline; the call was not sent and no hook server was asked",
                       "the runtime's connection was still being made at the call's deadline: "
                       "refused before its hooks")
    return Refusal(grpc.StatusCode.UNAVAILABLE,
                   f"runtime-proxy: the connection to the runtime at {socket} was not up within "
                   f"{NO_DEADLINE_WAIT_S:g} s (the call has no deadline); the call was not sent and no hook "
                   "server was asked",
                   f"the runtime's connection was not up within {NO_DEADLINE_WAIT_S:g} s: refused before its hooks")


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
