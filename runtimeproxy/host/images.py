"""OCI images made of the host's static busybox, built in pure Python.

No public registry is reachable here, so the images the private containerd
(and the tests) need are written as OCI image-layout archives that `ctr`
imports or `skopeo` pushes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import tarfile
from dataclasses import dataclass
from pathlib import Path

BUSYBOX_IMAGE = "localhost/runtime-proxy/busybox:1.0"
PAUSE_IMAGE = "localhost/runtime-proxy/pause:1.0"
BUSYBOX_BINARY = Path("/bin/busybox")

_APPLETS = (
    "sh", "ash", "sleep", "env", "cat", "echo", "ls", "true", "false", "ps",
    "id", "kill", "mkdir", "rm", "rmdir", "touch", "cp", "mv", "ln", "grep",
    "head", "tail", "wc", "date", "hostname", "printf", "test", "[", "sed",
    "awk", "tr", "cut", "sort", "uniq", "stat", "readlink", "find", "xargs",
    "dd", "mount", "df", "du", "free", "uname", "whoami", "nproc", "pwd",
    "chmod", "chown", "top", "sync", "yes", "seq", "timeout", "nc", "wget",
)
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# PID 1 ignores signals it has no handler for, so the pause process traps
# them; the backgrounded sleep keeps the shell able to run the trap at once.
_PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 2147483647 & wait $!; done"

_MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MT_INDEX = "application/vnd.oci.image.index.v1+json"
_MT_CONFIG = "application/vnd.oci.image.config.v1+json"
_MT_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
_EPOCH = "1970-01-01T00:00:00Z"


@dataclass(frozen=True)
class BusyboxImage:
    """An image made of the host's static busybox; only its ref and command differ."""

    ref: str
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


TEST_IMAGES = (
    BusyboxImage(BUSYBOX_IMAGE, cmd=("sh",)),
    BusyboxImage(PAUSE_IMAGE, entrypoint=("/bin/sh", "-c", _PAUSE_SCRIPT)),
)


def _oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def _tar_add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None,
             mode: int = 0o755, linkname: str | None = None) -> None:
    # Fixed owners and mtimes keep the layer digest reproducible.
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 0
    if linkname is not None:
        info.type = tarfile.SYMTYPE
        info.linkname = linkname
        tar.addfile(info)
    elif data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _busybox_layer(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "root", "sys", "usr", "usr/bin", "var"):
            _tar_add(tar, d)
        _tar_add(tar, "tmp", mode=0o1777)
        _tar_add(tar, "bin/busybox", data=busybox.read_bytes())
        for applet in _APPLETS:
            _tar_add(tar, f"bin/{applet}", linkname="busybox")
        _tar_add(tar, "etc/passwd", mode=0o644, data=(
            b"root:x:0:0:root:/root:/bin/sh\n"
            b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
        _tar_add(tar, "etc/group", mode=0o644, data=b"root:x:0:\nnobody:x:65534:\n")
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_image_archive(dest: Path, image: BusyboxImage, *, busybox: Path = BUSYBOX_BINARY) -> Path:
    """Write an OCI image-layout tar archive holding one busybox image."""
    layer = _busybox_layer(busybox)
    blobs: dict[str, bytes] = {}
    layer_desc = _blob(blobs, gzip.compress(layer, mtime=0), _MT_LAYER_GZIP)
    # The ref label gives every image its own config, hence its own image id in CRI.
    config: dict[str, object] = {"Env": [_PATH_ENV], "WorkingDir": "/",
                                 "Labels": {"org.opencontainers.image.ref.name": image.ref}}
    if image.entrypoint:
        config["Entrypoint"] = list(image.entrypoint)
    if image.cmd:
        config["Cmd"] = list(image.cmd)
    config_desc = _blob(blobs, _json({
        "created": _EPOCH,
        "architecture": _oci_arch(),
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": _EPOCH, "created_by": "runtimeproxy.host.images"}],
    }), _MT_CONFIG)
    manifest_desc = _blob(blobs, _json({
        "schemaVersion": 2, "mediaType": _MT_MANIFEST, "config": config_desc, "layers": [layer_desc],
    }), _MT_MANIFEST)
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": image.ref}
    index = {"schemaVersion": 2, "mediaType": _MT_INDEX, "manifests": [manifest_desc]}

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, "oci-layout", mode=0o644, data=_json({"imageLayoutVersion": "1.0.0"}))
        _tar_add(tar, "index.json", mode=0o644, data=_json(index))
        _tar_add(tar, "blobs")
        _tar_add(tar, "blobs/sha256")
        for digest, data in blobs.items():
            _tar_add(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", mode=0o644, data=data)
    return dest


def build_test_images(directory: Path, *, busybox: Path = BUSYBOX_BINARY) -> dict[str, Path]:
    """Build the busybox and pause archives; returns image ref -> archive path."""
    return {
        image.ref: build_image_archive(directory / f"{image.ref.rsplit('/', 1)[-1].replace(':', '-')}.tar",
                                       image, busybox=busybox)
        for image in TEST_IMAGES
    }
