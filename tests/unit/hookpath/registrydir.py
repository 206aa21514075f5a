"""The hook directory every registry test module starts from (the ``hook_dir``
fixture: a fresh, safe one in tmp_path), the registry's logger name, hook files
written into it (``valid_doc``, ``write``), and a ConfigMap volume's layout in
it and its update.

A test module binds the fixture as ``hook_dir = registrydir.hook_dir`` for pytest to find it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

LOGGER = "runtimeproxy.hookpath.registry"


def valid_doc(endpoint: str = "/run/hook.sock", **extra: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "remote-endpoint": endpoint,
        "failure-policy": "Fail",
        "runtime-hooks": ["PreCreateContainer"],
    }
    doc.update(extra)
    return doc


def write(directory: Path, name: str, content: object, mode: int = 0o644) -> Path:
    """Write a hook file (JSON-encoding non-str content) with an explicit mode, atomically."""
    path = directory / name
    text = content if isinstance(content, str) else json.dumps(content)
    tmp = directory / f".{name}.tmp"
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return path


def make_hook_dir(tmp_path: Path) -> Path:
    """A safe (root-owned, 0755) hook directory under tmp_path."""
    d = tmp_path / "hookserver.d"
    d.mkdir()
    os.chmod(d, 0o755)
    return d


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    return make_hook_dir(tmp_path)


def configmap_volume(hook_dir: Path, name: str) -> None:
    """``name`` in ``hook_dir`` as kubelet lays out a ConfigMap volume:
    name -> ..data/name, ..data -> v1 (endpoint /run/v1.sock), and v2 (/run/v2.sock)
    there for ``configmap_update`` to swap in."""
    for version, endpoint in (("v1", "/run/v1.sock"), ("v2", "/run/v2.sock")):
        (hook_dir / version).mkdir(mode=0o755)
        write(hook_dir / version, name, valid_doc(endpoint))
    (hook_dir / "..data").symlink_to("v1")
    (hook_dir / name).symlink_to(f"..data/{name}")


def configmap_update(hook_dir: Path) -> None:
    """``configmap_volume``'s ..data swapped to v2 in one rename, as kubelet updates it."""
    (hook_dir / "..data_tmp").symlink_to("v2")
    os.replace(hook_dir / "..data_tmp", hook_dir / "..data")
