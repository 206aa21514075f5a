"""The component suites of the CRI and hook paths, run again on ``--data-path frames``.

Every Proxy started by a test in this directory (through the fixtures or
``build_proxy``) takes the frames data path, whatever its config says; so
does every ``runtimeproxy serve`` process a test starts (asyncio).
"""

from __future__ import annotations

import asyncio
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


def serve_on_frames(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` with ``--data-path frames`` after ``serve`` when it runs the proxy's ``serve``
    (wrapped or not, e.g. by sockact.HeldSocket) and chooses no data path itself."""
    for i in range(1, len(argv) - 1):
        if argv[i] in ("runtimeproxy", "runtimeproxy.cli") and argv[i - 1] == "-m" and argv[i + 1] == "serve":
            if "--data-path" in argv:
                return argv
            return (*argv[: i + 2], "--data-path", "frames", *argv[i + 2 :])
    return argv


@pytest.fixture(autouse=True)
def frames_in_serve_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    spawn = asyncio.create_subprocess_exec

    async def on_frames(*argv: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        return await spawn(*serve_on_frames(tuple(map(str, argv))), **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", on_frames)
