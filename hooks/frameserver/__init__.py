"""The hook SDK's own HTTP/2 transport: gRPC unary calls served on raw frames.

grpc.aio's server spends about 0.8-0.9 ms of CPU on each hook call when the
calls are sparse, as they are in a pod lifecycle (six per pod), and on a
small node that CPU is taken from the runtime while the pod starts. A hook
call needs little of gRPC: unary calls, one message each way, a deadline
and a status. This transport speaks exactly that (connection.py) on a unix
socket (server.py), for about half of grpc.aio's CPU per call, and is
``HookServer``'s default; ``transport="grpc"`` keeps grpc.aio.
"""

from .calls import Call, CallError, Limits, Route, deadline_passed
from .server import FrameServer

__all__ = ["Call", "CallError", "FrameServer", "Limits", "Route", "deadline_passed"]
