"""A registry on the loopback, for a real PullImage path in the integration tests."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from runtimeproxy.host.images import BusyboxImage, build_image_archive
from runtimeproxy.host.process import (
    HostProcessError,
    run_command,
    tail,
    terminate_process,
)

log = logging.getLogger(__name__)

# Repository and tag of the busybox image in a LoopbackRegistry (its ref adds 127.0.0.1:<port>/).
REGISTRY_BUSYBOX_REPO = "runtime-proxy/busybox:1.0"


@dataclass
class LoopbackRegistry:
    """Debian's `docker-registry` on 127.0.0.1:<free port>, storing below `base`."""

    base: Path
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)
    _pump: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _port: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base = Path(self.base).resolve()

    @property
    def host(self) -> str:
        """"127.0.0.1:<port>", the registry part of image refs."""
        if self._port is None:
            raise HostProcessError("registry not started")
        return f"127.0.0.1:{self._port}"

    @property
    def log_path(self) -> Path:
        return self.base / "registry.log"

    def ref(self, repo_tag: str = REGISTRY_BUSYBOX_REPO) -> str:
        return f"{self.host}/{repo_tag}"

    async def __aenter__(self) -> LoopbackRegistry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout: float = 30.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        config = self.base / "registry.yml"
        # JSON is YAML. Port 0: the kernel picks a free port, and the registry logs it.
        config.write_text(json.dumps({
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.base / "storage")},
                        "maintenance": {"uploadpurging": {"enabled": False}}},
            "http": {"addr": "127.0.0.1:0", "secret": os.urandom(16).hex()},
        }))
        self._proc = await asyncio.create_subprocess_exec(
            "docker-registry", "serve", str(config), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        listening: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pump = asyncio.create_task(self._pump_log(listening))
        try:
            self._port = await asyncio.wait_for(listening, timeout)
        except BaseException:
            await self.stop()
            raise
        log.info("registry started", extra={"pid": self._proc.pid, "host": self.host})

    async def _pump_log(self, listening: asyncio.Future[int]) -> None:
        """Copy the registry's stderr to its log; resolve `listening` with the port it reports."""
        assert self._proc is not None and self._proc.stderr is not None
        with open(self.log_path, "ab") as logfile:
            async for line in self._proc.stderr:
                logfile.write(line)
                logfile.flush()
                if not listening.done() and b'msg="listening on 127.0.0.1:' in line:
                    port = line.split(b'msg="listening on 127.0.0.1:', 1)[1].split(b'"', 1)[0]
                    listening.set_result(int(port))
        if not listening.done():
            listening.set_exception(HostProcessError(
                f"docker-registry exited during start-up; log tail:\n{tail(self.log_path)}"))

    async def push(self, archive: Path, repo_tag: str = REGISTRY_BUSYBOX_REPO, timeout: float = 60.0) -> str:
        """Copy the single image in an OCI archive to repo_tag; returns its full ref."""
        ref = self.ref(repo_tag)
        rc, out = await run_command(
            "skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
            f"oci-archive:{archive}", f"docker://{ref}", timeout=timeout)
        if rc != 0:
            raise HostProcessError(f"skopeo copy to {ref} failed: {out.strip()}")
        return ref

    async def push_busybox(self, repo_tag: str = REGISTRY_BUSYBOX_REPO) -> str:
        """Push a busybox image (cmd `sh`) as repo_tag; returns its ref in this registry.

        Its image id differs from BUSYBOX_IMAGE's, so removing one leaves the other.
        """
        ref = self.ref(repo_tag)
        archive = build_image_archive(self.base / "images" / "busybox-push.tar", BusyboxImage(ref, cmd=("sh",)))
        return await self.push(archive, repo_tag)

    async def stop(self, grace: float = 5.0) -> None:
        if self._proc is not None:
            await terminate_process(self._proc, grace, "docker-registry")
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)  # ends at EOF
        log.info("registry stopped", extra={"base": str(self.base)})
