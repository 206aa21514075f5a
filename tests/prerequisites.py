"""Missing test prerequisites: a skip on a developer's machine, a failure in CI.

CI installs every prerequisite on purpose, so there a missing one means a
broken pipeline, not an optional test: `CI` set (to anything) turns the skip
into a failure.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import NoReturn

import pytest


def fail_or_skip(message: str, environ: Mapping[str, str] = os.environ) -> NoReturn:
    """Fail in CI (where the prerequisites are installed on purpose), skip elsewhere."""
    if environ.get("CI"):
        pytest.fail(message + " (CI is set, so this is an error)", pytrace=False)
    pytest.skip(message)


FOREIGN_ADDRESS = "192.0.2.1"  # TEST-NET-1 (RFC 5737): on no host


def foreign_address() -> str:
    """An IPv4 address this host cannot bind, for tests of that refusal. A
    host with net.ipv4.ip_nonlocal_bind=1 (keepalived, load balancers) binds
    any address, so the tests' premise does not hold there."""
    with socket.socket() as probe:
        try:
            probe.bind((FOREIGN_ADDRESS, 0))
        except OSError:
            return FOREIGN_ADDRESS
    fail_or_skip(f"this host binds {FOREIGN_ADDRESS} (net.ipv4.ip_nonlocal_bind=1?)")
