"""HookServer's start (hooks/sdk.py, hooks/sharedrun.py): a start while
another is under way waits for it and shares its outcome, one claim of the
socket's lock between them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hooks.sdk import HookServer, HookServerError
from runtimeproxy.host import socketlock

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


class SlowStart(HookServer):
    """``_before_serving`` waits for ``go``, then fails if ``fail`` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, grace=0, drain=0)
        self.preparing = asyncio.Event()
        self.go = asyncio.Event()
        self.fail: Exception | None = None

    async def _before_serving(self) -> None:
        self.preparing.set()
        await self.go.wait()
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths socketlock.claim was asked for."""
    asked: list[Path] = []
    real = socketlock.claim

    async def claim(path: Path, *args: Any, **kwargs: Any) -> socketlock.SocketLock:
        asked.append(path)
        return await real(path, *args, **kwargs)

    monkeypatch.setattr(socketlock, "claim", claim)
    return asked


async def test_a_second_start_while_the_first_is_under_way_waits_for_it_and_returns(
    sock_dir: Path, claims: list[Path]
) -> None:
    """Before: the second went on to claim the lock the first held, and was
    refused as in use by this very process (or waited on it)."""
    server = SlowStart(sock_dir / "h.sock")
    first = asyncio.ensure_future(server.start())
    await asyncio.wait_for(server.preparing.wait(), WAIT)
    second = asyncio.ensure_future(server.start())
    await asyncio.sleep(0)  # let the second run up to its wait
    assert not second.done()
    server.go.set()
    try:
        await asyncio.wait_for(asyncio.gather(first, second), WAIT)
        assert server.serving
        assert claims == [sock_dir / "h.sock"]
        with pytest.raises(HookServerError, match="already started"):  # after one that ended: as before
            await server.start()
    finally:
        await server.stop()


async def test_a_second_start_shares_the_first_s_failure_and_a_start_after_it_tries_again(
    sock_dir: Path, claims: list[Path]
) -> None:
    server = SlowStart(sock_dir / "h.sock")
    server.fail = RuntimeError("state unreadable")
    first = asyncio.ensure_future(server.start())
    await asyncio.wait_for(server.preparing.wait(), WAIT)
    second = asyncio.ensure_future(server.start())
    await asyncio.sleep(0)
    server.go.set()
    results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), WAIT)
    assert [str(r) for r in results] == ["state unreadable"] * 2
    assert not server.serving and len(claims) == 1
    server.fail = None
    await asyncio.wait_for(server.start(), WAIT)  # the lock was let go: a new start claims it
    await server.stop()
