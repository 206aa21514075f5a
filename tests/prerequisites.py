"""Missing test prerequisites: a skip on a developer's machine, a failure in CI.

CI installs every prerequisite on purpose, so there a missing one means a
broken pipeline, not an optional test: `CI` set (to anything) turns the skip
into a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
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


LINK_LOCAL_ADDRESS = "fe80::1"  # of LINK_LOCAL_INTERFACE in in_network_namespace's namespace
LINK_LOCAL_INTERFACE = "d0"
_ROOT = Path(__file__).resolve().parent.parent  # this checkout: runtimeproxy and tests importable

# lo up; d0 a veth, not a dummy: on a modular kernel `type dummy` loads
# dummy.ko, which makes dummy0 in the host's namespace (numdummies=1); the
# address without duplicate detection (else tentative for a while: no bind).
_NAMESPACE_SETUP = (
    "ip link set lo up"
    f" && ip link add {LINK_LOCAL_INTERFACE} type veth peer name {LINK_LOCAL_INTERFACE}peer"
    f" && ip addr add {LINK_LOCAL_ADDRESS}/64 dev {LINK_LOCAL_INTERFACE} nodad"
    f" && ip link set {LINK_LOCAL_INTERFACE} up"
)


def in_network_namespace(code: str, setup: str = "", args: Sequence[str] = ()) -> str:
    """Run the Python ``code`` in a network namespace of its own, the host's
    network left alone: lo up, ``LINK_LOCAL_ADDRESS`` on ``LINK_LOCAL_INTERFACE``
    (for the tests of a scoped address, fe80::1%d0), then the shell commands
    ``setup`` (a sysctl of that namespace's, written to /proc/sys/net: no
    procps); returns what ``code`` printed (``args`` its sys.argv[1:]).
    Needs ``unshare`` and ``ip``, and root (CI runs as root) or user namespaces."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        fail_or_skip("a test in a network namespace of its own needs `unshare` (util-linux) and `ip` (iproute2)")
    script = _NAMESPACE_SETUP + (f" && {setup}" if setup else "") + ' && echo ready && exec "$@"'
    unshare = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--net"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([*unshare, "sh", "-c", script, "sh", sys.executable, "-c", code, *args],
                          capture_output=True, text=True, env=env, timeout=60)
    ready, _newline, printed = done.stdout.partition("\n")
    if ready != "ready":
        fail_or_skip(f"no network namespace with a link-local address here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return printed


def cgroup_v1_cpuset_mounted(mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether this host mounts the cgroup v1 cpuset controller (at its root,
    without cpuset_v2_mode): where the parent cgroup's cpuset rule holds. Read
    here apart from parentcpuset.py, so a test can hold it to what it finds."""
    for line in mountinfo.read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, super_fields = before.split(), after.split()
        if len(fields) > 4 and len(super_fields) > 2 and super_fields[0] == "cgroup":
            options = super_fields[2].split(",")
            if "cpuset" in options and "cpuset_v2_mode" not in options and fields[3] == "/":
                return True
    return False
