"""Putting every proxy a test starts on one data path (``--data-path``).

The suites run on the default data path; the re-run directories
(``grpcpath/``) run them again on the other one, and ``frames/`` holds the
frames path's own tests. Each directory's conftest applies ``on_data_path``
autouse: Proxies built in-process (the fixtures, ``build_proxy``) and
``runtimeproxy serve`` processes started with asyncio both follow it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from runtimeproxy.frames.path import FramesPath


def with_data_path(argv: tuple[str, ...], path: str) -> tuple[str, ...]:
    """``argv`` with ``--data-path PATH`` after ``serve`` when it runs the proxy's ``serve``
    (wrapped or not, e.g. by sockact.HeldSocket) and chooses no data path itself."""
    for i in range(1, len(argv) - 1):
        if argv[i] in ("runtimeproxy", "runtimeproxy.cli") and argv[i - 1] == "-m" and argv[i + 1] == "serve":
            if "--data-path" in argv:
                return argv
            return (*argv[: i + 2], "--data-path", path, *argv[i + 2 :])
    return argv


def on_data_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    # The function under the classmethod, to call with another class: mypy types the bound
    # classmethod as a plain callable, without its __func__.
    choose = FramesPath.from_config.__func__  # type: ignore[attr-defined]

    def chosen(cls: type[FramesPath], config: Any, *args: Any) -> Any:
        return choose(cls, dataclasses.replace(config, data_path=path), *args)

    monkeypatch.setattr(FramesPath, "from_config", classmethod(chosen))
    spawn = asyncio.create_subprocess_exec

    async def spawn_on_path(*argv: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        return await spawn(*with_data_path(tuple(map(str, argv)), path), **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn_on_path)
