"""fail_or_skip: a missing prerequisite skips, except under CI where it
fails; in_network_namespace leaves the host's network alone;
cgroup_v1_cpuset_mounted: where the parent cgroup's cpuset rule holds."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ..prerequisites import LINK_LOCAL_INTERFACE, cgroup_v1_cpuset_mounted, fail_or_skip, in_network_namespace


@pytest.mark.parametrize("value", ["true", "1"])
def test_missing_prerequisite_fails_under_ci(value: str) -> None:
    with pytest.raises(pytest.fail.Exception, match="no tool .*CI is set, so this is an error"):
        fail_or_skip("no tool", {"CI": value})


@pytest.mark.parametrize("environ", [{}, {"CI": ""}])
def test_missing_prerequisite_skips_outside_ci(environ: dict[str, str]) -> None:
    with pytest.raises(pytest.skip.Exception, match="^no tool$"):
        fail_or_skip("no tool", environ)


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        fail_or_skip("no tool")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        fail_or_skip("no tool")


def test_the_namespace_s_interface_is_a_veth_never_a_dummy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ip link add ... type dummy` loads dummy.ko on a modular kernel, which
    makes dummy0 in the host's namespace (numdummies=1): a machine others share."""
    real_ip = shutil.which("ip")
    if real_ip is None:
        fail_or_skip("a test in a network namespace of its own needs `ip` (iproute2)")
    calls = tmp_path / "calls"
    recording = tmp_path / "ip"
    recording.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real_ip} "$@"\n')
    recording.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    printed = in_network_namespace(f"import socket; print(socket.if_nametoindex({LINK_LOCAL_INTERFACE!r}))")
    assert int(printed) > 0
    made = [call for call in calls.read_text().splitlines() if call.startswith("link add")]
    assert made == [f"link add {LINK_LOCAL_INTERFACE} type veth peer name {LINK_LOCAL_INTERFACE}peer"]


@pytest.mark.parametrize(("mount", "mounted"), [
    ("34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset", True),
    ("34 31 0:31 / /sys/fs/cgroup/cpu,cpuset rw shared:9 - cgroup cgroup rw,cpu,cpuset", True),
    ("34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset,cpuset_v2_mode", False),
    ("34 31 0:31 /kubepods /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset", False),
    ("30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate", False),
    ("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu", False),
])
def test_a_cgroup_v1_cpuset_mount_is_found(tmp_path: Path, mount: str, mounted: bool) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"22 1 0:21 / / rw - ext4 /dev/vda1 rw\n{mount}\n")
    assert cgroup_v1_cpuset_mounted(mountinfo) is mounted
