"""The kubelet binary of the node tier: found in the shared directory, unpacked once, checked.

`../shared/kubelet/kubelet-v1.26.4.xz` (or `$RUNTIME_PROXY_SHARED/kubelet/...`)
is xz-compressed; it is unpacked into a cache directory named after the
sha256 of the unpacked binary, and that sha256 is checked on every use, so a
truncated or foreign file is never run.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KUBELET_ARCHIVE = Path("kubelet") / "kubelet-v1.26.4.xz"
KUBELET_SHA256 = "d1268932cfab3f04d3a3860ff7752a05891d0fb3bff434f74dd9fe44bf6910a3"
KUBELET_VERSION = "v1.26.4"
_CHUNK = 1 << 20


class KubeletBinaryError(RuntimeError):
    """The archive is missing or does not hold the expected kubelet."""


def shared_dir(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    """The upstream contracts and tools: `$RUNTIME_PROXY_SHARED`, else `../shared` beside the checkout."""
    return Path(environ.get("RUNTIME_PROXY_SHARED", ROOT.parent / "shared"))


def archive_path(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    return shared_dir(environ) / KUBELET_ARCHIVE


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def unpacked_kubelet(archive: Path, cache: Path, sha256: str = KUBELET_SHA256) -> Path:
    """The unpacked, checked kubelet in ``cache/<sha256>/kubelet``, unpacking it if needed.

    Unpacked to a temporary file and renamed, so concurrent runs sharing the
    cache never see half a binary.
    """
    target = cache / sha256 / "kubelet"
    if target.is_file() and sha256_of(target) == sha256:
        return target
    if not archive.is_file():
        raise KubeletBinaryError(f"no kubelet archive at {archive}")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".kubelet-")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, lzma.open(archive) as src:
            shutil.copyfileobj(src, out, _CHUNK)
        found = sha256_of(tmp)
        if found != sha256:
            raise KubeletBinaryError(f"{archive} unpacks to sha256 {found}, expected {sha256}")
        tmp.chmod(0o755)
        tmp.replace(target)
    except lzma.LZMAError as exc:
        raise KubeletBinaryError(f"{archive} is not a valid xz archive: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target
