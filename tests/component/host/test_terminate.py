"""terminate_process: SIGTERM, then SIGKILL for a process that ignores it."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from runtimeproxy.host.process import terminate_process

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
)


async def start(code: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"ready\n"
    return proc


async def test_process_that_ignores_sigterm_is_killed_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    proc = await start(IGNORES_SIGTERM)
    with caplog.at_level(logging.WARNING, logger="runtimeproxy.host.process"):
        await asyncio.wait_for(terminate_process(proc, 0.3, "stubborn"), 10)
    assert proc.returncode == -9
    (record,) = [r for r in caplog.records if r.getMessage() == "process ignored signal"]
    assert (record.proc, record.signal) == ("stubborn", "SIGTERM")


async def test_process_that_obeys_sigterm_is_not_killed() -> None:
    proc = await start("import time; print('ready', flush=True); time.sleep(60)")
    await asyncio.wait_for(terminate_process(proc, 5, "polite"), 10)
    assert proc.returncode == -15
    await terminate_process(proc, 5, "polite")  # already gone: returns at once
