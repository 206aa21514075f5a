"""Missing test prerequisites: a skip on a developer's machine, a failure in CI.

CI installs every prerequisite on purpose, so there a missing one means a
broken pipeline, not an optional test: `CI` set (to anything) turns the skip
into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest


def fail_or_skip(message: str, environ: Mapping[str, str] = os.environ) -> NoReturn:
    """Fail in CI (where the prerequisites are installed on purpose), skip elsewhere."""
    if environ.get("CI"):
        pytest.fail(message + " (CI is set, so this is an error)", pytrace=False)
    pytest.skip(message)
