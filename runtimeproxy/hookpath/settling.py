"""Work that shutdown waits for before the backend goes: a count and its event."""

from __future__ import annotations

import asyncio


class Unsettled:
    """Calls being recorded, or whose request the runtime already has
    (``HookStage.settle`` waits for them). One reusable context manager,
    entered by each such call: no generator nor object per call, as a
    ``contextlib.contextmanager`` would make (two per hooked call)."""

    def __init__(self) -> None:
        self.count = 0
        self.none = asyncio.Event()  # set exactly while the count is 0
        self.none.set()

    def __enter__(self) -> None:
        if not self.count:
            self.none.clear()
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        self.count -= 1
        if not self.count:
            self.none.set()
