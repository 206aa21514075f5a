"""A standalone kubelet (static pods, no API server) as a child process.

What it takes to run one on a shared machine (see ../shared/kubelet/README.md):

* a private `--root-dir`, manifest directory and `cgroupRoot`, free loopback
  ports, and a unique node name (static pod names and uids derive from it,
  so the pods' log directories are told apart from anyone else's);
* a private mount namespace in which small files holding the values kubelet
  wants are bind-mounted over the sysctls it would otherwise write, so the
  host keeps its settings, and in which `/var/lib` is overlaid by a private
  upper directory: kubelet writes its device-plugin socket under the fixed
  `/var/lib/kubelet/device-plugins`, whatever `--root-dir` says, and two
  kubelets (two test runs) must not share it. The namespace (and any mount
  kubelet makes) disappears with the process.

kubelet serves HTTPS (a self-signed certificate, anonymous access allowed) on
the loopback: `/pods` (static pods with their status), `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import ssl
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.procs import free_tcp_port
from runtimeproxy.host.process import tail, terminate_process
from runtimeproxy.host.unixsocket import grpc_target

from .cgroups import CgroupRoot

# The sysctls kubelet sets at start unless they already read so (pkg/kubelet/cm, setupKernelTunables).
KERNEL_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
_HTTP_TIMEOUT = 5.0
_POLL = 0.2
_STOP_GRACE = 10.0

# metric name -> sorted label pairs -> value
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


class KubeletError(RuntimeError):
    """kubelet did not come up or exited."""


def read_sysctls() -> dict[str, str]:
    """The host's values of the sysctls kubelet would set (read in our own mount namespace)."""
    return {key: Path(f"/proc/sys/{key}").read_text().strip() for key in KERNEL_TUNABLES}


def parse_metrics(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """One metric's values summed per value of one label."""
    out: dict[str, float] = {}
    for labels, value in samples.get(name, {}).items():
        key = dict(labels).get(label, "")
        out[key] = out.get(key, 0.0) + value
    return out


def http_get(url: str) -> bytes:
    """GET over the loopback; kubelet's own certificate is self-signed, so it is not verified."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT, context=context) as response:
        return response.read()


@dataclass
class Kubelet:
    """One kubelet run: `start()`, then `stop()` (idempotent); everything it owns lives under `base`."""

    binary: Path
    base: Path
    endpoint: Path  # the CRI socket: the proxy's, or containerd's for a direct run
    pause_image: str
    cgroups: CgroupRoot
    node_name: str = field(default_factory=lambda: f"rp-node-{uuid.uuid4().hex[:8]}")
    verbosity: int = 2  # 2 logs which CRI version kubelet settled on
    port: int = field(default_factory=free_tcp_port)
    healthz_port: int = field(default_factory=free_tcp_port)
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)

    @property
    def manifests(self) -> Path:
        return self.base / "manifests"

    @property
    def root_dir(self) -> Path:
        return self.base / "root"

    @property
    def log_path(self) -> Path:
        return self.base / "kubelet.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    def config(self) -> dict[str, Any]:
        """The KubeletConfiguration: static pods, cgroupfs below our root, loopback only, no GC pressure."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "staticPodPath": str(self.manifests),
            "fileCheckFrequency": "2s",  # a removed manifest is noticed quickly
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroups.parent,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                             "imagefs.available": "1%"},
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "volumePluginDir": str(self.base / "volume-plugins"),  # the default is a host path
            "resolvConf": "",
        }

    def _namespace_setup(self) -> list[str]:
        """Shell commands run in kubelet's mount namespace before it starts."""
        commands = []
        for key, value in KERNEL_TUNABLES.items():
            source = self.base / "sysctl" / key.replace("/", ".")
            source.write_text(value + "\n")
            commands.append(f"mount --bind {shlex.quote(str(source))} /proc/sys/{key}")
        upper, work = self.base / "var-lib" / "upper", self.base / "var-lib" / "work"
        options = shlex.quote(f"lowerdir=/var/lib,upperdir={upper},workdir={work}")
        commands.append(f"mount -t overlay overlay -o {options} /var/lib")
        return commands

    def argv(self) -> list[str]:
        """unshare + a shell that prepares the mount namespace, then execs kubelet."""
        script = "set -e; " + "; ".join(self._namespace_setup()) + '; exec "$0" "$@"'
        socket = grpc_target(self.endpoint)  # kubelet decodes %XX as grpc does
        return [
            "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script,
            str(self.binary),
            f"--config={self.base / 'kubelet.yaml'}",
            "--container-runtime=remote",
            f"--container-runtime-endpoint={socket}",
            f"--image-service-endpoint={socket}",
            f"--hostname-override={self.node_name}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.root_dir / 'pki'}",
            f"--pod-infra-container-image={self.pause_image}",
            f"--v={self.verbosity}",
        ]

    async def start(self, timeout: float = 60.0) -> None:
        """Start kubelet and wait until its healthz answers ok."""
        for directory in (self.base, self.manifests, self.root_dir, self.base / "sysctl",
                          self.base / "var-lib" / "upper", self.base / "var-lib" / "work"):
            directory.mkdir(parents=True, exist_ok=True)
        (self.base / "kubelet.yaml").write_text(yaml.safe_dump(self.config()))
        with open(self.log_path, "ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv(), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        try:
            await self._wait_healthy(timeout)
        except BaseException:
            await self.stop()
            raise

    async def _wait_healthy(self, timeout: float) -> None:
        assert self._proc is not None
        last = "not answering"
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if self._proc.returncode is not None:
                        raise KubeletError(f"kubelet exited with status {self._proc.returncode}:\n{self.log_tail()}")
                    try:
                        if await asyncio.to_thread(http_get, f"http://127.0.0.1:{self.healthz_port}/healthz") == b"ok":
                            return
                    except OSError as exc:
                        last = str(exc)
                    await asyncio.sleep(_POLL)
        except TimeoutError:
            raise KubeletError(f"kubelet not healthy within {timeout}s ({last}):\n{self.log_tail()}") from None

    async def stop(self) -> None:
        if self._proc is not None:
            await terminate_process(self._proc, _STOP_GRACE, "kubelet")

    def alive(self) -> bool:
        return self.pid is not None

    def log_tail(self, lines: int = 40, width: int = 400) -> str:
        """The end of kubelet's log for a failure message (some of its lines are kilobytes long)."""
        return "\n".join(line[:width] for line in tail(self.log_path, lines).splitlines())

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    # ---- what an operator asks kubelet --------------------------------------

    async def get(self, path: str) -> bytes:
        return await asyncio.to_thread(http_get, f"https://127.0.0.1:{self.port}{path}")

    async def pods(self) -> list[dict[str, Any]]:
        """kubelet's static pods with the status it holds for them (`/pods`)."""
        return json.loads(await self.get("/pods"))["items"]

    async def metrics(self) -> Samples:
        return parse_metrics((await self.get("/metrics")).decode())

    async def runtime_operations(self) -> tuple[dict[str, float], dict[str, float]]:
        """kubelet's CRI calls so far per operation: (all, failed)."""
        samples = await self.metrics()
        return (by_label(samples, "kubelet_runtime_operations_total", "operation_type"),
                by_label(samples, "kubelet_runtime_operations_errors_total", "operation_type"))
