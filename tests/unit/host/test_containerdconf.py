"""The private containerd's config.toml: every path below its base, NRI only when asked."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from runtimeproxy.host.containerdconf import ContainerdConfig, check_loopback
from runtimeproxy.host.images import PAUSE_IMAGE

CRI = "io.containerd.grpc.v1.cri"


def _config(base: Path, **overrides: object) -> ContainerdConfig:
    fields: dict[str, object] = dict(
        base=base, socket=base / "containerd.sock", runc_root=base / "runc", cni_conf_dir=base / "cni",
        log_level="warn", snapshotter="native",
    )
    fields.update(overrides)
    return ContainerdConfig(**fields)  # type: ignore[arg-type]


def test_everything_containerd_keeps_is_below_its_base() -> None:
    base = Path('/tmp/a dir "quoted"\\x')  # quotes and a backslash survive the TOML strings
    doc = tomllib.loads(_config(base).toml())
    assert doc["root"] == str(base / "root")
    assert doc["state"] == str(base / "state")
    assert doc["grpc"]["address"] == str(base / "containerd.sock")
    assert doc["ttrpc"]["address"] == str(base / "containerd.sock") + ".ttrpc"
    assert doc["debug"] == {"address": "", "level": "warn"}
    cri = doc["plugins"][CRI]
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["snapshotter"] == "native"
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {"Root": str(base / "runc"), "SystemdCgroup": False}
    assert cri["cni"]["conf_dir"] == str(base / "cni")
    assert cri["registry"] == {"config_path": ""}
    assert "io.containerd.nri.v1.nri" not in doc["plugins"]


def test_nri_and_plain_http_registries_when_asked(tmp_path: Path) -> None:
    config = _config(tmp_path, nri_socket=tmp_path / "nri.sock", nri_request_timeout=1.5,
                     plain_http_registries=("127.0.0.1:5000",))
    doc = tomllib.loads(config.toml())
    nri = doc["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False
    assert nri["socket_path"] == str(tmp_path / "nri.sock")
    assert nri["plugin_path"] == str(tmp_path / "nri-plugins")
    assert nri["plugin_request_timeout"] == "1.5s"
    assert doc["plugins"][CRI]["registry"]["mirrors"] == {"127.0.0.1:5000": {"endpoint": ["http://127.0.0.1:5000"]}}


@pytest.mark.parametrize("host", ["10.0.0.1:5000", "127.0.0.1", "localhost:5000", "127.0.0.1:port"])
def test_only_loopback_registries(tmp_path: Path, host: str) -> None:
    with pytest.raises(ValueError, match="not a 127.0.0.1:<port> registry"):
        check_loopback(host)
    with pytest.raises(ValueError, match="not a 127.0.0.1:<port> registry"):
        _config(tmp_path, plain_http_registries=(host,))
