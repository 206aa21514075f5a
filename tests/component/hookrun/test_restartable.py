"""``hook run`` exits 1, which the unit restarts, for a socket directory it
cannot make *now*: at boot /run may still be read-only, and a directory
another unit makes may not have its mode yet. Exit 2 (never restarted) is
kept for what no restart cures (test_run.py's unusable paths)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocs import stderr_within

from ...prerequisites import fail_or_skip
from .conftest import REPO

# Each runs `hook run` with the rest of the command line ("$@") where the
# socket's directory cannot be made: as root, so the kernel has to refuse.
DENIED = {
    # A read-only mount, as /run before its remount.
    "read-only": (["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o ro,size=64k tmpfs "$0" && exec "$@"'],
                  "Read-only file system"),
    # A directory root may not write to: without the capability that bypasses its mode.
    "no permission": (["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "sh", "-c", 'exec "$@"'],
                      "Permission denied"),
}


def _usable(prefix: list[str], where: Path) -> bool:
    """Whether this host lets the test set the refusal up (namespaces and capabilities)."""
    if shutil.which(prefix[0]) is None:
        return False
    return subprocess.run([*prefix, str(where), "true"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.parametrize("case", DENIED, ids=list(DENIED))
async def test_a_socket_directory_refused_for_now_exits_1_in_one_line(case: str, sock_dir: Path) -> None:
    prefix, reason = DENIED[case]
    parent = sock_dir / "run"
    parent.mkdir(mode=0o555)
    if not _usable(prefix, parent):
        fail_or_skip(f"{prefix[0]} cannot set up the refusal here")
    sock, hook_dir = parent / "hooks" / "h.sock", sock_dir / "hooks.d"
    process = await asyncio.create_subprocess_exec(
        *prefix, str(parent), sys.executable, "-m", "runtimeproxy", "hook", "run", "noop",
        "--socket", str(sock), "--hook-dir", str(hook_dir), "--log-format", "json",
        cwd=REPO, stderr=asyncio.subprocess.PIPE,
    )
    err = await stderr_within(process, 60)
    assert process.returncode == 1, err.decode()  # restarted by the unit, unlike 2
    lines = [json.loads(line) for line in err.decode().splitlines()]  # log lines only: no traceback
    (failed,) = [line for line in lines if line["msg"] == "cannot serve"]
    assert failed["error"] == f"cannot create the directory of {sock}: {reason}"
    assert not hook_dir.exists()  # nothing registered
