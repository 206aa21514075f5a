"""The shared containerd 1.7.13 build, unpacked once (cached by its sha256)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from ..prerequisites import fail_or_skip

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("RUNTIME_PROXY_SHARED", ROOT.parent / "shared"))
ARCHIVE = SHARED / "containerd-1.7" / "containerd-1.7.13.tar.xz"
CACHE = Path(tempfile.gettempdir()) / "runtime-proxy-cache"


def containerd17_bin_dir() -> Path:
    """The unpacked ``bin/`` of the shared containerd 1.7.13 (once per archive content)."""
    if not ARCHIVE.is_file():
        fail_or_skip(f"no containerd 1.7 archive at {ARCHIVE} (set RUNTIME_PROXY_SHARED)")
    digest = hashlib.sha256(ARCHIVE.read_bytes()).hexdigest()
    target = CACHE / f"containerd-{digest}"
    if not (target / "bin" / "containerd").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=CACHE, prefix="unpacking-"))
        try:
            with tarfile.open(ARCHIVE, "r:xz") as archive:
                archive.extractall(staging, filter="data")
            try:
                staging.rename(target)  # atomic: another run may have got there first
            except OSError:
                if not (target / "bin" / "containerd").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target / "bin"
