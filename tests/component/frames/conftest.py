"""The component suites of the CRI and hook paths, run again on ``--data-path frames``.

Every Proxy started by a test in this directory (through the fixtures or
``build_proxy``) takes the frames data path, whatever its config says.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runtimeproxy.cripath import server


@pytest.fixture(autouse=True)
def frames_data_path(monkeypatch: pytest.MonkeyPatch) -> None:
    choose = server._frames_path

    def on_frames(config: Any, *args: Any) -> Any:
        return choose(dataclasses.replace(config, data_path="frames"), *args)

    monkeypatch.setattr(server, "_frames_path", on_frames)
