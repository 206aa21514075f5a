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
  would have at the runtime.

The refusal's text and its debug line are the same on every data path.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
from grpc import aio

log = logging.getLogger(__name__)

_S = grpc.ChannelConnectivity
_UNDECIDED = (_S.IDLE, _S.CONNECTING)


def refusal(socket: Path) -> str:
    """The status message of a hooked call refused because its runtime is not reachable."""
    return (f"runtime-proxy: the runtime at {socket} is not reachable (its connection failed; the proxy "
            "reconnects by itself); the call was not sent and no hook server was asked")


def log_refusal(method: str, socket: Path) -> None:
    """A refusal is a debug line, as other calls failing in an outage are: the
    runtime's outage has its own lines (backend.py)."""
    log.debug("call failed", extra={"method": method, "code": "UNAVAILABLE", "backend": str(socket),
                                    "error": "the runtime is not reachable: refused before its hooks"})


async def connects(channel: aio.Channel, state: grpc.ChannelConnectivity, limit: float | None) -> bool:
    """Whether ``channel``, in ``state`` (not READY), has a connection to its
    runtime within ``limit`` seconds (None: grpc's own connect timeout bounds
    an attempt): False at once in TRANSIENT_FAILURE or SHUTDOWN, else once the
    connection attempt it makes (for an idle one, from now) succeeds or fails."""
    try:
        async with asyncio.timeout(limit):
            if state is _S.IDLE:
                state = channel.get_state(try_to_connect=True)
            while state in _UNDECIDED:
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)
    except TimeoutError:
        return False  # past the call's deadline: its client has given up on it
    return state is _S.READY
