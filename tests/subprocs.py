"""Child processes a test waits out."""

from __future__ import annotations

import asyncio


async def stderr_within(process: asyncio.subprocess.Process, timeout: float) -> bytes:
    """``process``'s stderr (piped) once it has ended, within ``timeout``;
    killed if it has not by then, so that no child outlives its test."""
    try:
        _, err = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return err
