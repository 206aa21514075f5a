"""Backend.probe_soon: a call's UNIMPLEMENTED from a runtime lost and not
probed again ends the wait before the next probe, but never brings probes
closer together than PROBE_SOON_S, however many calls fail so; a probed
runtime's UNIMPLEMENTED changes nothing."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from pathlib import Path

import pytest

from runtimeproxy.cripath import backend as backend_module
from runtimeproxy.cripath.backend import Backend, BackendInfo, BackendUnavailable
from runtimeproxy.cripath.methods import ApiVersion

INFO = BackendInfo(frozenset({ApiVersion.V1}), "fake", "1")


def _backend(failures: int, began: list[float]) -> Backend:
    """Its probes fail ``failures`` times, then answer; each one's start is
    noted as the backend noted it (``_attempted``, what PROBE_SOON_S is
    counted from: the loop's clock read here, a step later, would carry
    that step's own time into the gaps); the wait between probes never
    ends by itself."""
    backend = Backend(Path("/nonexistent.sock"), None, [])
    left = [failures]

    async def probe_once() -> BackendInfo:
        began.append(backend._attempted)
        if left[0]:
            left[0] -= 1
            raise BackendUnavailable("server is not initialized yet")
        return INFO

    async def never(seconds: float) -> None:
        await asyncio.Event().wait()

    backend.probe_once = probe_once  # type: ignore[method-assign]
    backend._sleep = never
    return backend


async def test_unimplemented_calls_end_the_wait_at_most_once_per_probe_soon_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_module, "PROBE_SOON_S", 0.05)
    began: list[float] = []
    backend = _backend(3, began)
    probing = asyncio.ensure_future(backend.probe())
    deadline = asyncio.get_running_loop().time() + 5  # without probe_soon the wait never ends: fail, not hang
    try:
        while not probing.done() and asyncio.get_running_loop().time() < deadline:
            backend.probe_soon()  # a storm of UNIMPLEMENTED answers, one each loop turn
            await asyncio.sleep(0)
        assert probing.done(), f"still waiting after {len(began)} probe(s)"
    finally:
        probing.cancel()
    assert probing.result() == INFO
    assert len(began) == 4  # three failed, then the one that answered, each brought forward
    gaps = [later - earlier for earlier, later in pairwise(began)]
    assert min(gaps) >= 0.05 * 0.99, gaps  # (the loop's clock may round a timer a little early)


async def test_without_a_call_the_wait_runs_its_course() -> None:
    began: list[float] = []
    backend = _backend(1, began)
    probing = asyncio.ensure_future(backend.probe())
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(began) == 1 and not probing.done()  # waiting (for ever, here)
    backend.probe_soon()
    assert await asyncio.wait_for(probing, 5) == INFO
    assert backend.connected
    backend.probe_soon()  # probed: nothing is waiting, nothing happens
    assert len(began) == 2
