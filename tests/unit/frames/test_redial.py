"""The frames listener re-dials the runtime for connections spliced after a
failed dial from 1 s, doubling, at most every 30 s."""

from __future__ import annotations

from itertools import islice

from runtimeproxy.frames import listener


def test_the_redial_waits_double_up_to_the_most() -> None:
    assert (listener.REDIAL_FIRST_S, listener.REDIAL_MAX_S) == (1.0, 30.0)
    assert list(islice(listener.redial_delays(1.0, 30.0), 7)) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
