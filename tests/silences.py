"""A Silence (frames/silent.py) for tests: it records what it is told."""

from __future__ import annotations


class Told:
    """Records each reason it is told (and warns of each); ``known``: whether
    it knows the runtime silent (a new connection's bound is short)."""

    def __init__(self, known: bool = False) -> None:
        self.told: list[str] = []
        self.is_known = known

    def __call__(self, reason: str) -> bool:
        self.told.append(reason)
        return True

    def known(self) -> bool:
        return self.is_known
