"""README's run command: a proxy in front of a private containerd it starts itself."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from grpc import aio

from runtimeproxy.host.images import BUSYBOX_IMAGE, PAUSE_IMAGE
from runtimeproxy.host.process import mounts_under, shim_pids, terminate_process

from ..component.test_process import wait_for_line
from .conftest import require_local_containerd
from .crihelpers import APIS


async def test_serve_with_local_containerd() -> None:
    require_local_containerd()
    base = Path(tempfile.mkdtemp(prefix="rpl-", dir="/tmp"))
    listen = base / "proxy.sock"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "serve",
        "--local-containerd", str(base / "containerd"), "--listen", str(listen), "--hook-dir", str(base / "hooks"),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        lines = await wait_for_line(process.stderr, "serving v1 (native), v1alpha2 (native)", timeout=90)
        assert any(f"crictl --runtime-endpoint unix://{listen}" in line for line in lines)
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            for api in APIS:
                version = await api.runtime(channel).Version(api.pb.VersionRequest(), timeout=10)
                assert (version.runtime_name, version.runtime_api_version) == ("containerd", api.version)
                listed = await api.images(channel).ListImages(api.pb.ListImagesRequest(), timeout=10)
                assert {BUSYBOX_IMAGE, PAUSE_IMAGE} <= {tag for image in listed.images for tag in image.repo_tags}
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.stderr.read(), 60)
        assert await asyncio.wait_for(process.wait(), 60) == 0
        assert not listen.exists()
        containerd_socket = base / "containerd" / "containerd.sock"
        assert shim_pids(containerd_socket) == []
        assert mounts_under(base) == []
    finally:
        # SIGTERM first: the proxy stops its private containerd then (SIGKILL would orphan it).
        await terminate_process(process, 60, "runtime-proxy serve")
        shutil.rmtree(base, ignore_errors=True)
