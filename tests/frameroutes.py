"""What a frames connection is told of each path, for tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Routes:
    """Calls on ``relayed`` paths pass verbatim (every path, by default);
    ``diverted`` paths (none, by default) go to the proxy's own server; the
    rest are hooked in place with ``stages``. ``unary``: whether calls are
    waited for on shutdown (False: streams, ended at once)."""

    def __init__(
        self, relayed: Callable[[str], bool] = lambda path: True, stages: tuple[Any, ...] = (), unary: bool = True,
        diverted: Callable[[str], bool] = lambda path: False,
    ) -> None:
        self._relayed, self._stages, self._unary, self._diverted = relayed, stages, unary, diverted

    def ready(self) -> bool:
        return True

    def fast(self, path: str) -> bool:
        return self._relayed(path)

    def unary(self, path: str) -> bool:
        return self._unary

    def hooked(self, path: str) -> tuple[Any, ...] | None:
        return None if self._relayed(path) or self._diverted(path) else self._stages

    def sends_unchanged(self, path: str) -> bool:
        return False

    def measure(self, path: str) -> None:
        return None

    def runtime_unimplemented(self) -> None:
        pass

    def runtime_failed_status(self, status: int, message: str) -> None:
        pass
