"""Whether a backend has a CRI service, asked without calling any of its methods.

Why: containerd 1.7 records the deprecation
``io.containerd.deprecation/cri-api-v1alpha2`` at the first v1alpha2 CRI call
it serves, and operators read that list (``ctr deprecations list``) to check
a node is ready for containerd 2.0, which has no v1alpha2. The proxy's own
probes asking v1alpha2's Version or ImageFsInfo put it there on every 1.7
node, even when kubelet speaks only v1: a false alarm.

A Go gRPC server (containerd, CRI-O) answers a method that does not exist
UNIMPLEMENTED before any handler runs, so containerd's CRI code never sees
it: "unknown method M for service S" when the service S is registered,
"unknown service S" when it is not. Any other answer (grpc-python's
"Method not found!", another code, an answer at all from a server that takes
any method) does not tell: the caller makes its real call, as before.
"""

from __future__ import annotations

import grpc
from grpc import aio

# A method no CRI version has: the name says whose call it was in a runtime's logs.
NO_SUCH_METHOD = "RuntimeProxyNoSuchMethod"


def told(service: str, code: grpc.StatusCode, details: str) -> bool | None:
    """What an answer to ``NO_SUCH_METHOD`` of ``service`` (e.g.
    "runtime.v1alpha2.RuntimeService") says: True, the service is there;
    False, it is not; None, it does not tell."""
    if code != grpc.StatusCode.UNIMPLEMENTED:
        return None
    if details == f"unknown method {NO_SUCH_METHOD} for service {service}":
        return True
    if details == f"unknown service {service}":
        return False
    return None


async def registered(channel: aio.Channel, service: str, timeout: float) -> bool | None:
    """Whether ``service`` is registered on ``channel``'s server, as ``told``
    reads its answer to a method that does not exist (None: not told)."""
    try:
        await channel.unary_unary(f"/{service}/{NO_SUCH_METHOD}")(b"", timeout=timeout)
    except aio.AioRpcError as err:
        return told(service, err.code(), err.details() or "")
    return None  # answered: whatever listens takes any method
