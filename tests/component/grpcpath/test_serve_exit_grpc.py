"""tests/component/test_serve_exit.py on the grpc data path: its script runs `serve`
itself, so the data path is passed to it here (conftest.py's patch looks for
`-m runtimeproxy serve`)."""

from __future__ import annotations

from pathlib import Path

from ..fakes import FakeBackend
from ..test_serve_exit import serve_ends_when_a_task_keeps_failing


async def test_a_task_that_keeps_failing_ends_serve_with_a_non_zero_exit(fake: FakeBackend, sock_dir: Path) -> None:
    await serve_ends_when_a_task_keeps_failing(fake, sock_dir, "--data-path", "grpc")
