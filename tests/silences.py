"""A Silence (frames/silent.py) for tests: it counts the times it is told."""

from __future__ import annotations


class Told:
    """Counts the silences it is told of (and warns of each); ``known``:
    whether it knows the runtime silent (a new connection's bound is short)."""

    def __init__(self, known: bool = False) -> None:
        self.told = 0
        self.is_known = known

    def __call__(self) -> bool:
        self.told += 1
        return True

    def known(self) -> bool:
        return self.is_known
