"""Go-style duration strings ("500ms", "1.5s", "1m30s"), as hook files and
Koordinator write them."""

from __future__ import annotations

import math
import re
from decimal import Decimal

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign, as Go accepts
    "μs": 1_000,  # U+03BC greek mu, as Go accepts
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_DURATION_RE = re.compile(rf"(?:{_DURATION_PART})+")
_DURATION_PART_RE = re.compile(_DURATION_PART)


def parse_duration(text: str) -> float:
    """Parse a Go-style duration string ("500ms", "1.5s", "2m", "1m30s") into seconds.

    Every number needs a unit (ns, us/µs, ms, s, m, h); signs are not accepted.
    Raises ``ValueError`` on malformed input.  Zero is returned as 0.0 (callers
    decide whether it is acceptable).
    """
    if not isinstance(text, str):
        raise ValueError(f"duration must be a string like \"2s\", got {type(text).__name__}")
    if not _DURATION_RE.fullmatch(text):
        raise ValueError(
            f"invalid duration {text!r} (expected a number with a unit, e.g. \"500ms\", \"1.5s\", \"2m\")"
        )
    parts = _DURATION_PART_RE.findall(text)
    total_ns = sum((Decimal(number) * _DURATION_UNITS_NS[unit] for number, unit in parts), Decimal(0))
    seconds = float(total_ns / 1_000_000_000)
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {text!r}: out of range")
    return seconds


def format_duration(seconds: float) -> str:
    """Inverse of :func:`parse_duration` for display/writing: 2.0 -> "2s", 0.5 -> "500ms"."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"duration must be a number of seconds, got {seconds!r}")
    if seconds <= 0 or not math.isfinite(seconds):
        raise ValueError(f"duration must be a positive finite number of seconds, got {seconds!r}")
    value = Decimal(repr(float(seconds)))
    for unit, factor in (("s", 1), ("ms", Decimal("1e-3")), ("us", Decimal("1e-6")), ("ns", Decimal("1e-9"))):
        scaled = value / factor
        if scaled >= 1 or unit == "ns":
            text = format(scaled.normalize(), "f")
            return f"{text}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover
