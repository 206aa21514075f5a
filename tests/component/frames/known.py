"""Re-run tests that fail on the frames data path because of a known frames bug.

Each stays in its re-run as a strict xfail naming the bug (narrowed to the
exception it fails with): it still runs, and once the bug is fixed it passes,
which fails the run until the mark is taken away.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest


def frames_bug(test: Callable[..., Any], reason: str, raises: type[BaseException]) -> Callable[..., Any]:
    """``test`` (imported from the grpc suite) marked for this re-run only; the original keeps no mark."""

    @functools.wraps(test)
    async def rerun(*args: Any, **kwargs: Any) -> None:
        await test(*args, **kwargs)

    rerun.pytestmark = list(getattr(test, "pytestmark", []))  # a copy: the grpc run's test stays unmarked
    return pytest.mark.xfail(strict=True, reason=reason, raises=raises)(rerun)
