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
A registered service is taken as served: a stub v1alpha2 whose Version
answers UNIMPLEMENTED is taken as there, where its real Version left it out
(no known runtime has one: containerd 1.7's v1alpha2 shares v1's service).

The question and the real call share one probe timeout (``Budget``): the
question (and, for images, the wait for v1's answer) its first SHARE, the
real call, when still needed, the rest, so a probe costs one timeout as
before whichever of them hangs, and a real call still needed is sent with
at least the rest.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from grpc import aio

# A method no CRI version has: the name says whose call it was in a runtime's logs.
NO_SUCH_METHOD = "RuntimeProxyNoSuchMethod"
# Of a probe's timeout, the part for the question; half leaves the real call
# as long as a grpc-go server takes to answer either (it answers at once).
SHARE = 0.5


@dataclass(frozen=True)
class Budget:
    """One probe timeout, as loop times: the question's part ends at
    ``asked_by``, the whole at ``end``."""

    asked_by: float
    end: float

    @classmethod
    def of(cls, timeout: float) -> Budget:
        now = asyncio.get_running_loop().time()
        return cls(now + timeout * SHARE, now + timeout)

    def asking(self) -> float:
        """What is left of the question's part (seconds, 0 when spent)."""
        return max(self.asked_by - asyncio.get_running_loop().time(), 0.0)

    def left(self) -> float:
        """What is left of the whole, for the real call: at least the rest
        after the question's part, as that part ends by ``asked_by``."""
        return max(self.end - asyncio.get_running_loop().time(), 0.0)


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
