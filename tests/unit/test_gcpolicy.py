"""The collector's settings for the proxy's processes (runtimeproxy/gcpolicy.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from runtimeproxy import gcpolicy


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_start_up_is_kept_out_of_later_collections_which_come_less_often(restored_gc: None) -> None:
    gc.unfreeze()
    kept = [[n] for n in range(1000)]  # tracked containers that live on
    gcpolicy.before_serving()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_count()[0] < 100  # collected first, then frozen: the young generation is empty
    assert gc.get_threshold() == gcpolicy.THRESHOLDS
    assert gcpolicy.THRESHOLDS[0] > 700  # CPython's default
