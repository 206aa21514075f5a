"""A CRI request the proxy cannot decode, which no hook can see: refused
while a Fail hook must see it, else sent on as it came."""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError
from grpc import aio

from ..cripath.stage import Send, request_sent
from .dispatch import Dispatcher
from .executor import HookedMethod
from .hookfile import FailurePolicy

log = logging.getLogger("runtimeproxy.hookpath.stage")  # the stage's lines, as before this module


class Undecodable(Exception):
    """A request no hook could see, refused because a Fail hook must see it."""


async def undecodable(
    dispatcher: Dispatcher, point: HookedMethod, request: bytes, exc: DecodeError, context: aio.ServicerContext,
    send: Send,
) -> bytes:
    """A request the proxy cannot read (say, a label that is not UTF-8: Python's
    protobuf refuses it, containerd accepts it) cannot be shown to hooks.
    Forwarding it anyway would let a pod bypass a Fail hook's limits."""
    servers = [s for hook in (point.pre, point.post) if hook is not None for s in dispatcher.servers(hook)]
    failing = [s.name for s in servers if s.failure_policy is FailurePolicy.FAIL]
    fields = {"method": point.method, "error": str(exc), "hook_servers": [s.name for s in servers]}
    if failing and not request_sent(context):  # (sent: the Fail server came after the runtime had it)
        log.warning("undecodable request refused: a Fail hook must see it", extra={**fields, "fail_hooks": failing})
        raise Undecodable(
            f"runtime-proxy: cannot decode the {point.method} request ({exc}), and hook server(s) "
            f"{', '.join(failing)} with failure-policy Fail must see it; the call was not sent to the runtime"
        )
    if servers:
        log.warning("undecodable request sent on without hooks", extra={**fields, "fail_hooks": failing})
    return await send(request)  # nobody must see it: the runtime judges it, as without the proxy
