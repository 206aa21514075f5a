"""The SDK's line per served hook call, at debug: which calls the proxy made
and how each ended, for a hook author asking why a hook did not apply.

One line per call a handler was called for, in the SDK's logger (``hooks.sdk``):
``PreCreateContainer hook call answered in 0.002s``, its fields the hook
point, the pod (``namespace/name`` and uid) and container (name and id)
where the request has them, the handler's time, and the outcome:
``answered``, ``error`` (with the gRPC code the caller gets),
``deadline_exceeded`` or ``cancelled`` (the caller hung up, or the server
stopped). A handler's failure keeps its own line at its own level beside it
(``hooks.sdk``'s exception, ``hooks.cancelled``'s warning or info).

A request the transport could not decode reaches no handler: its line
(``log_undecodable``) says so, with the hook point, the gRPC method, the
request's size and the decoder's error (``outcome``: ``undecodable``), so a
caller whose calls fail ``INTERNAL`` (``UNKNOWN`` on grpc.aio) is seen to
have called, and with what.

The caller checks the level first (``logger.isEnabledFor``): an answered
call costs nothing more while debug is off.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf.message import Message

from runtimeproxy.hookpath.points import HookType

__all__ = ["ANSWERED", "CANCELLED", "DEADLINE_EXCEEDED", "ERROR", "UNDECODABLE", "log_call", "log_undecodable"]

ANSWERED = "answered"
ERROR = "error"
DEADLINE_EXCEEDED = "deadline_exceeded"
CANCELLED = "cancelled"
UNDECODABLE = "undecodable"


def log_call(logger: logging.Logger, hook: HookType, request: Message, ran_s: float, outcome: str,
             code: grpc.StatusCode | None = None) -> None:
    """Log one call at debug (the caller has checked the level)."""
    fields: dict[str, object] = {"hook": hook.value, "outcome": outcome, "duration_s": round(ran_s, 6)}
    if code is not None:
        fields["grpc_code"] = code.name
    fields.update(request_fields(request))
    logger.debug("%s hook call %s in %.3fs%s", hook.value, outcome.replace("_", " "), ran_s,
                 f" ({code.name})" if code is not None else "", extra=fields)


def log_undecodable(logger: logging.Logger, hook: HookType, method: str, size: int, error: Exception) -> None:
    """Log a request of ``size`` bytes that is no ``hook`` request, at debug (the caller has checked the level)."""
    logger.debug("%s hook call could not be decoded: %d bytes, %s", hook.value, size, error, extra={
        "hook": hook.value, "method": method, "outcome": UNDECODABLE, "request_bytes": size, "error": str(error)})


def request_fields(request: Message) -> dict[str, str]:
    """The pod and container a hook request names, as far as it names them
    (both kinds of request carry ``pod_meta``; a container's, ``container_meta``)."""
    fields = {}
    pod = getattr(request, "pod_meta", None)
    if pod is not None and (pod.name or pod.uid):
        fields["pod"] = f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name
        fields["pod_uid"] = pod.uid
    container = getattr(request, "container_meta", None)
    if container is not None and (container.name or container.id):
        fields["container"] = container.name
        fields["container_id"] = container.id
    return fields
