"""What `serve --local-containerd` tells its user once containerd is up."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from runtimeproxy import logs
from runtimeproxy.cli import _tell_local_usage
from runtimeproxy.config import ProxyConfig


def test_text_names_the_endpoint_the_hook_dir_and_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = ProxyConfig(listen=tmp_path / "proxy.sock", hook_dir=tmp_path / "hooks")
    _tell_local_usage(config, tmp_path / "containerd.sock")
    err = capsys.readouterr().err
    assert f"private containerd at {tmp_path / 'containerd.sock'}" in err
    assert f"  kubelet --container-runtime-endpoint=unix://{tmp_path / 'proxy.sock'}" in err
    assert f"hook servers register in {tmp_path / 'hooks'} (--hook-dir)" in err
    assert f"  runtime-proxy status --listen {tmp_path / 'proxy.sock'}" in err


def test_json_logs_keep_stderr_one_json_document_a_line(
    tmp_path: Path, restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under --log-format json it wrote four plain lines among the JSON ones on stderr."""
    logs.setup("json", "info")
    config = ProxyConfig(listen=tmp_path / "proxy.sock", hook_dir=tmp_path / "hooks", log_format="json")
    _tell_local_usage(config, tmp_path / "containerd.sock")
    captured = capsys.readouterr()
    (doc,) = [json.loads(line) for line in captured.err.splitlines()]
    assert doc["msg"] == "private containerd ready; point clients at the proxy"
    assert (doc["containerd"], doc["endpoint"]) == (str(tmp_path / "containerd.sock"), f"unix://{tmp_path / 'proxy.sock'}")
    assert doc["hook_dir"] == str(tmp_path / "hooks")
    assert doc["status"] == f"runtime-proxy status --listen {tmp_path / 'proxy.sock'}"
    assert doc["kubelet"] == f"kubelet --container-runtime-endpoint=unix://{tmp_path / 'proxy.sock'}"
    assert captured.out == ""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_hint_shows_at_every_log_level(
    fmt: str, tmp_path: Path, restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under --log-format json it was an info line, hidden by --log-level warning; the text always printed."""
    logs.setup(fmt, "error")
    config = ProxyConfig(listen=tmp_path / "proxy.sock", hook_dir=tmp_path / "hooks", log_format=fmt)
    logging.getLogger("runtimeproxy").info("an info line --log-level error hides")
    _tell_local_usage(config, tmp_path / "containerd.sock")
    err = capsys.readouterr().err
    assert "hides" not in err
    assert f"kubelet --container-runtime-endpoint=unix://{tmp_path / 'proxy.sock'}" in err
    if fmt == "json":
        (doc,) = [json.loads(line) for line in err.splitlines()]
        assert (doc["level"], doc["logger"]) == ("info", "runtimeproxy")
