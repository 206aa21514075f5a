"""terminate_process and terminate_pids: SIGTERM, then SIGKILL for a process that ignores it."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from runtimeproxy.host.process import terminate_pids, terminate_process

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


async def test_pids_are_terminated_together_and_stubborn_ones_killed() -> None:
    polite = await start("import time; print('ready', flush=True); time.sleep(60)")
    stubborn = await start(IGNORES_SIGTERM)
    await asyncio.wait_for(terminate_pids([polite.pid, stubborn.pid], 0.3), 10)
    codes = await asyncio.wait_for(asyncio.gather(polite.wait(), stubborn.wait()), 10)
    assert codes == [-15, -9]
    await terminate_pids([polite.pid], 5)  # already gone: returns at once
