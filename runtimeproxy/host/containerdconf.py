"""The config.toml of a private containerd (`containerd.LocalContainerd`).

Everything containerd keeps lives below one base directory: root, state,
sockets, runc's root, the CNI config dir and NRI's plugin dirs, so nothing
of the host's containerd is read or written. Plugins never used here are
disabled: start-up neither probes for them nor logs their failures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .images import PAUSE_IMAGE

CNI_BIN_DIR = Path("/usr/lib/cni")

DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.internal.v1.tracing",
    "io.containerd.tracing.processor.v1.otlp",
)


def check_loopback(host: str) -> None:
    """Registries here are private test fixtures: only ever talk to one on the loopback."""
    address, _, port = host.rpartition(":")
    if address != "127.0.0.1" or not port.isdigit():
        raise ValueError(f"not a 127.0.0.1:<port> registry: {host!r}")


def _q(value: str | Path) -> str:
    return json.dumps(str(value))  # JSON string escapes are valid TOML basic strings


@dataclass(frozen=True)
class ContainerdConfig:
    """What differs between private containerds; the rest is fixed below."""

    base: Path
    socket: Path  # the gRPC socket; ttrpc's is beside it
    runc_root: Path
    cni_conf_dir: Path
    log_level: str
    snapshotter: str
    # "127.0.0.1:<port>" registries that CRI PullImage reaches over plain HTTP.
    plain_http_registries: tuple[str, ...] = ()
    nri_socket: Path | None = None  # None: NRI off (containerd 1.6 has none)
    nri_request_timeout: float = 2.0  # seconds

    def __post_init__(self) -> None:
        for host in self.plain_http_registries:
            check_loopback(host)

    def toml(self) -> str:
        b = self.base
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return "\n".join([
            "version = 2",
            f"root = {_q(b / 'root')}",
            f"state = {_q(b / 'state')}",
            "oom_score = 0",
            "disabled_plugins = [" + ", ".join(_q(p) for p in DISABLED_PLUGINS) + "]",
            "",
            "[grpc]",
            f"  address = {_q(self.socket)}",
            "[ttrpc]",
            f"  address = {_q(str(self.socket) + '.ttrpc')}",
            "[debug]",
            '  address = ""',  # no debug socket: nothing reads it
            f"  level = {_q(self.log_level)}",
            "[metrics]",
            '  address = ""',
            "",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_q(b / 'opt')}",
            f"{cri}]",
            f"  sandbox_image = {_q(PAUSE_IMAGE)}",
            # The VM forbids lowering oom_score_adj below our own; runc fails otherwise.
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  disable_tcp_service = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            # Should a pod get a netns anyway, its bind mount is below base, where stop() unmounts.
            "  netns_mounts_under_state_dir = true",
            f"{cri}.containerd]",
            f"  snapshotter = {_q(self.snapshotter)}",
            '  default_runtime_name = "runc"',
            f"{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{cri}.containerd.runtimes.runc.options]",
            f"  Root = {_q(self.runc_root)}",
            "  SystemdCgroup = false",
            # Pods must use the host network: no CNI config, and the host's is kept out.
            f"{cri}.cni]",
            f"  bin_dir = {_q(CNI_BIN_DIR)}",
            f"  conf_dir = {_q(self.cni_conf_dir)}",
            f"{cri}.registry]",
            '  config_path = ""',
            *(line for host in self.plain_http_registries for line in (
                f"{cri}.registry.mirrors.{_q(host)}]",
                f"  endpoint = [{_q('http://' + host)}]",
            )),
            *self._nri(),
            "",
        ])

    def _nri(self) -> list[str]:
        if self.nri_socket is None:
            return []
        return [
            '[plugins."io.containerd.nri.v1.nri"]',
            "  disable = false",
            "  disable_connections = false",  # plugins connect to the socket themselves
            f"  socket_path = {_q(self.nri_socket)}",
            f"  plugin_path = {_q(self.base / 'nri-plugins')}",
            f"  plugin_config_path = {_q(self.base / 'nri-conf')}",
            '  plugin_registration_timeout = "5s"',
            f"  plugin_request_timeout = {_q(f'{self.nri_request_timeout:g}s')}",
        ]
