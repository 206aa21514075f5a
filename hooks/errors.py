"""What a hook server's handler raises to fail a call, and what the SDK
raises when a server cannot start; all importable from :mod:`hooks.sdk`."""

from __future__ import annotations

import grpc

__all__ = ["HookAbort", "HookServerError", "SocketPathError"]


class HookAbort(Exception):
    """Raise from a handler to answer the call with a specific gRPC status."""

    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.INTERNAL, details: str = "") -> None:
        super().__init__(details or code.name)
        self.code = code
        self.details = details


class HookServerError(RuntimeError):
    """The hook server could not start (socket in use, bad path...)."""


class SocketPathError(HookServerError):
    """Nothing can listen at the socket path as the disk stands (a file in
    the way of its directory, not a socket there): a restart will not help."""
