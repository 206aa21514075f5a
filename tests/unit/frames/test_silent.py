"""frames/silent.py: the bound on a runtime's silence is armed only while
its SETTINGS have not come."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtimeproxy.cripath.unready import Unready
from runtimeproxy.frames import silent
from tests.fakeclock import frozen_time
from tests.silences import Told


async def test_no_bound_once_the_runtimes_settings_came() -> None:
    """The backend's attach, just before the bound, may deliver the SETTINGS
    the runtime sent while it was dialled: nothing is left to wait for
    (before: a timer was armed, and held until the connection ended)."""
    told = Told()
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn = SimpleNamespace(prefaced=True, closed=closed, settings_wait=None)
    silent.bound(conn, Path("/run/containerd/containerd.sock"), told)  # type: ignore[arg-type]
    assert conn.settings_wait is None and told.told == 0


async def test_a_connection_whose_runtime_said_nothing_yet_is_bounded() -> None:
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn = SimpleNamespace(prefaced=False, closed=closed, settings_wait=None)
    silent.bound(conn, Path("/run/containerd/containerd.sock"), Told())  # type: ignore[arg-type]
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
        with frozen_time(loop) as now:  # (before: 0.2 s of slack against a clock a loaded machine moved)
            silent.bound(conn, Path("/run/containerd/containerd.sock"), Told(known))  # type: ignore[arg-type]
        timer = conn.settings_wait
        assert isinstance(timer, asyncio.TimerHandle)
        assert timer.when() - now == pytest.approx(wait), known
        conn.closed.set_result(None)


def _conn(loop: asyncio.AbstractEventLoop, sent: list[bytes]) -> SimpleNamespace:
    """A connection whose runtime said nothing yet; its GOAWAY (any control frame) goes to ``sent``."""
    return SimpleNamespace(prefaced=False, closed=loop.create_future(), settings_wait=None, relayed=set(), hooked={},
                           diverted={}, identity={}, lost=lambda: None,
                           out=SimpleNamespace(release=lambda: None, control=sent.append, flush=lambda: None))


def _fire(conn: SimpleNamespace) -> None:
    """Run the bound's timer now (its time come)."""
    timer = conn.settings_wait
    assert isinstance(timer, asyncio.TimerHandle) and not timer.cancelled()
    callback, args = timer._callback, timer._args  # cancel() forgets them
    timer.cancel()
    callback(*args)


async def test_a_runtime_that_answered_during_the_short_bound_gets_the_rest_of_the_full_one() -> None:
    """The short bound ends, but the runtime answered a Status meanwhile (no
    longer known silent): the connection is not told to go away, it waits the
    rest of the full bound; that rest is the last: once it ends the client is
    told to go away, the GOAWAY naming the full bound (before: a second timer
    given the short wait's length would re-arm the rest again and again)."""
    loop = asyncio.get_running_loop()
    unready = Unready(Path("/run/containerd/containerd.sock"))  # nothing asks its Status
    silences = silent.Silences(unready)
    silences()  # a connection met the full bound: known silent
    sent: list[bytes] = []
    conn = _conn(loop, sent)
    with frozen_time(loop) as now:  # (before: 0.2 s of slack against a clock a loaded machine moved)
        silent.bound(conn, Path("/run/containerd/containerd.sock"), silences)  # type: ignore[arg-type]
        timer = conn.settings_wait
        assert isinstance(timer, asyncio.TimerHandle)
        assert timer.when() - now == pytest.approx(silent.KNOWN_SILENT_WAIT_S)
        unready.ready()  # it answered a Status during the short wait
        _fire(conn)
        assert sent == [] and unready.reason is None  # no GOAWAY, nothing told
        rest = conn.settings_wait
        assert isinstance(rest, asyncio.TimerHandle)
        assert rest.when() - now == pytest.approx(silent.SETTINGS_WAIT_S - silent.KNOWN_SILENT_WAIT_S)
    _fire(conn)  # the runtime still said nothing, the full bound over
    assert conn.settings_wait is None and len(sent) == 1
    assert f"sent no SETTINGS within {silent.SETTINGS_WAIT_S:g} s".encode() in sent[0]
    assert unready.reason == silent.REASON


async def test_a_short_bound_met_keeps_the_reason_that_names_the_full_one() -> None:
    """A connection that meets the short bound tells the Unready the same
    reason as the first silence did, naming the full bound (the refusals and
    the line that ends the outage say so, as the docs quote); only its GOAWAY
    names the short wait (before: the reason became '... within 0.5 s' at
    the first short bound met, and the runtime was no longer known silent)."""
    loop = asyncio.get_running_loop()
    unready = Unready(Path("/run/containerd/containerd.sock"))  # nothing asks its Status
    silences = silent.Silences(unready)
    silences()
    for _ in range(2):  # known silent still after the first short bound met
        assert silences.known()
        sent: list[bytes] = []
        conn = _conn(loop, sent)
        silent.bound(conn, Path("/run/containerd/containerd.sock"), silences)  # type: ignore[arg-type]
        _fire(conn)
        assert len(sent) == 1 and f"within {silent.KNOWN_SILENT_WAIT_S:g} s".encode() in sent[0]
        assert unready.reason == silent.REASON
        assert f"within {silent.SETTINGS_WAIT_S:g} s" in unready.refusal_text()


def test_silences_know_the_runtime_silent_until_it_answers_or_shows_it_speaks() -> None:
    """Known silent: the Unready's reason is still the silence's. An answered
    Status (ready) or another sign ('not initialized': it speaks HTTP/2) ends it."""
    unready = Unready(Path("/run/containerd/containerd.sock"))  # nothing asks its Status
    silences = silent.Silences(unready)
    assert not silences.known()
    silences()
    assert silences.known()
    unready.saw("it answers 'server is not initialized yet'")
    assert not silences.known()
    silences()
    assert silences.known()
    unready.ready()
    assert not silences.known()
