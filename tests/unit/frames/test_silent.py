"""frames/silent.py: the bound on a runtime's silence is armed only while
its SETTINGS have not come."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from runtimeproxy.cripath.unready import Unready
from runtimeproxy.frames import silent


class _Told:
    """A Silence that records what it is told; ``known``: whether it knows the runtime silent."""

    def __init__(self, known: bool = False) -> None:
        self.told: list[str] = []
        self.is_known = known

    def __call__(self, reason: str) -> bool:
        self.told.append(reason)
        return True

    def known(self) -> bool:
        return self.is_known


async def test_no_bound_once_the_runtimes_settings_came() -> None:
    """The backend's attach, just before the bound, may deliver the SETTINGS
    the runtime sent while it was dialled: nothing is left to wait for
    (before: a timer was armed, and held until the connection ended)."""
    told = _Told()
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn = SimpleNamespace(prefaced=True, closed=closed, settings_wait=None)
    silent.bound(conn, Path("/run/containerd/containerd.sock"), told)  # type: ignore[arg-type]
    assert conn.settings_wait is None and told.told == []


async def test_a_connection_whose_runtime_said_nothing_yet_is_bounded() -> None:
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn = SimpleNamespace(prefaced=False, closed=closed, settings_wait=None)
    silent.bound(conn, Path("/run/containerd/containerd.sock"), _Told())  # type: ignore[arg-type]
    timer = conn.settings_wait
    assert isinstance(timer, asyncio.TimerHandle) and not timer.cancelled()
    closed.set_result(None)
    await asyncio.sleep(0)  # the done callback runs in the next loop turn
    assert timer.cancelled()


async def test_the_bound_is_short_while_the_runtime_is_known_silent() -> None:
    """A client retrying after a silent runtime's GOAWAY is told to go away
    again after KNOWN_SILENT_WAIT_S (before: the full SETTINGS_WAIT_S each
    time); one whose runtime is not known silent waits the full bound."""
    loop = asyncio.get_running_loop()
    for known, wait in ((True, silent.KNOWN_SILENT_WAIT_S), (False, silent.SETTINGS_WAIT_S)):
        conn = SimpleNamespace(prefaced=False, closed=loop.create_future(), settings_wait=None)
        silent.bound(conn, Path("/run/containerd/containerd.sock"), _Told(known))  # type: ignore[arg-type]
        timer = conn.settings_wait
        assert isinstance(timer, asyncio.TimerHandle)
        assert abs(timer.when() - loop.time() - wait) < 0.2, known
        conn.closed.set_result(None)


async def test_a_runtime_that_answered_during_the_short_bound_gets_the_rest_of_the_full_one() -> None:
    """The short bound ends, but the runtime answered a Status meanwhile (no
    longer known silent): the connection is not told to go away, it waits the
    rest of the full bound."""
    loop = asyncio.get_running_loop()
    told = _Told(known=False)
    sent: list[bytes] = []
    conn = SimpleNamespace(prefaced=False, closed=loop.create_future(), settings_wait=None, relayed=set(), hooked={},
                           diverted={}, identity={}, lost=lambda: None,
                           out=SimpleNamespace(release=lambda: None, control=sent.append, flush=lambda: None))
    silent._expired(conn, Path("/run/containerd/containerd.sock"), told, silent.KNOWN_SILENT_WAIT_S)  # type: ignore[arg-type]  # noqa: SLF001
    timer = conn.settings_wait
    assert told.told == [] and sent == []  # no GOAWAY
    assert isinstance(timer, asyncio.TimerHandle)
    rest = silent.SETTINGS_WAIT_S - silent.KNOWN_SILENT_WAIT_S
    assert abs(timer.when() - loop.time() - rest) < 0.2
    timer.cancel()


def test_silences_know_the_runtime_silent_until_it_answers_or_shows_it_speaks() -> None:
    """Known silent: the Unready's reason is still the silence's. An answered
    Status (ready) or another sign ('not initialized': it speaks HTTP/2) ends it."""
    unready = Unready(Path("/run/containerd/containerd.sock"))  # nothing asks its Status
    silences = silent.Silences(unready)
    assert not silences.known()
    silences("it accepted a connection but sent no HTTP/2 SETTINGS within 5 s")
    assert silences.known()
    unready.saw("it answers 'server is not initialized yet'")
    assert not silences.known()
    silences("it accepted a connection but sent no HTTP/2 SETTINGS within 5 s")
    assert silences.known()
    unready.ready()
    assert not silences.known()
