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


def link_local_address() -> tuple[str, str]:
    """A link-local IPv6 address of this host and its interface's name, for
    the tests of a scoped address (fe80::...%IF); a skip where there is none
    (IPv6 off, a network namespace with only lo): not a prerequisite CI sets up."""
    try:
        with open("/proc/net/if_inet6") as table:  # address, ifindex, prefix length, scope, flags, name
            rows = [line.split() for line in table]
    except OSError:
        rows = []
    for hexaddr, _index, _prefix, scope, flags, name in rows:
        if int(scope, 16) == 0x20 and not int(flags, 16) & 0x48:  # link scope; not tentative, DAD not failed
            address = ":".join(hexaddr[i:i + 4] for i in range(0, 32, 4))
            return socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, address)), name
    pytest.skip("no link-local IPv6 address on this host")
