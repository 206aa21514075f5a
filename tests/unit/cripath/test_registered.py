"""Reading an answer to a method that does not exist (cripath/registered.py)."""

from __future__ import annotations

import grpc
import pytest

from runtimeproxy.cripath.registered import NO_SUCH_METHOD, told

SERVICE = "runtime.v1alpha2.RuntimeService"
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(("code", "details", "expected"), [
    # grpc-go's words (containerd 1.7.13 answers so)
    (UNIMPLEMENTED, f"unknown method {NO_SUCH_METHOD} for service {SERVICE}", True),
    (UNIMPLEMENTED, f"unknown service {SERVICE}", False),
    # not told: grpc-python's, another service's, another method's, another code
    (UNIMPLEMENTED, "Method not found!", None),
    (UNIMPLEMENTED, "unknown service runtime.v1.RuntimeService", None),
    (UNIMPLEMENTED, f"unknown method Version for service {SERVICE}", None),
    (UNIMPLEMENTED, f"unknown method {NO_SUCH_METHOD} for service runtime.v1alpha2.ImageService", None),
    (UNIMPLEMENTED, f"unknown method {NO_SUCH_METHOD} for service {SERVICE} (proxied)", None),
    (UNIMPLEMENTED, f"unknown service {SERVICE}.", None),
    (grpc.StatusCode.UNKNOWN, f"unknown service {SERVICE}", None),
    (grpc.StatusCode.UNAVAILABLE, "connection refused", None),
])
def test_told(code: grpc.StatusCode, details: str, expected: bool | None) -> None:
    assert told(SERVICE, code, details) is expected
