"""The hook directory every registry test module starts from (the ``hook_dir``
fixture: a fresh, safe one in tmp_path) and the registry's logger name.

A test module binds the fixture as ``hook_dir = registrydir.hook_dir`` for pytest to find it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_hookfile import make_hook_dir

LOGGER = "runtimeproxy.hookpath.registry"


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    return make_hook_dir(tmp_path)
