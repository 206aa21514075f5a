"""The private containerd's images (`images`), imported with `ctr` into the
CRI namespace, and waited for until the CRI plugin lists them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc

from . import unixsocket
from .images import build_test_images
from .process import HostProcessError, run_command

log = logging.getLogger(__name__)

K8S_NAMESPACE = "k8s.io"  # the containerd namespace of the CRI plugin

# For the private containerd's CRI calls and polls, here and in containerd.py.
CALL_TIMEOUT = 5.0
POLL_INTERVAL = 0.05


class ImageImportFailed(HostProcessError):
    """``ctr images import`` failed."""


async def import_test_images(ctr: str, socket: Path, snapshotter: str, directory: Path,
                             timeout: float = 30.0) -> None:
    """Import the busybox and pause images (built in ``directory``) into the
    CRI namespace of the containerd on ``socket``.

    Waits until the CRI plugin lists them: it learns about imports from
    containerd events, so ctr returning is not enough. ``timeout`` bounds
    each ctr run; the caller bounds the whole (LocalContainerd's start).
    """
    archives = build_test_images(directory)
    for ref, archive in archives.items():
        rc, out = await run_command(
            ctr, "--address", str(socket), "-n", K8S_NAMESPACE, "images", "import",
            "--base-name", ref.rsplit(":", 1)[0], "--snapshotter", snapshotter, str(archive), timeout=timeout)
        if rc != 0:
            raise ImageImportFailed(f"ctr images import {archive} failed: {out.strip()}")
    async with aio.insecure_channel(unixsocket.grpc_target(socket)) as channel:
        stub = v1_grpc.ImageServiceStub(channel)
        for ref in archives:
            # Bounded by the caller's timeout; CRI offers no event for images appearing.
            while not (await stub.ImageStatus(  # noqa: ASYNC110 - CRI has no event for an image appearing; bounded by the caller's timeout
                    v1.ImageStatusRequest(image=v1.ImageSpec(image=ref)),
                    timeout=CALL_TIMEOUT)).HasField("image"):
                await asyncio.sleep(POLL_INTERVAL)
    log.info("images imported", extra={"images": sorted(archives)})
