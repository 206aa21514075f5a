"""Kubernetes resource quantities (``500``, ``1k``, ``128Mi``, ``1e9``, ``0.5``) as exact numbers.

Follows ``k8s.io/apimachinery/pkg/api/resource``: a signed decimal number and
one optional suffix, either binary (Ki..Ei), decimal SI (n, u, m, "", k, M,
G, T, P, E) or a decimal exponent (``e3``/``E3``). ``Value()`` rounds up to an
integer, which is what Koordinator reads for batch-cpu and batch-memory.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["QuantityError", "parse_quantity", "quantity_value"]


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_NUMBER = r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
_SUFFIX = r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d{1,9}|[numkMGTPE]?)"  # (9 digits: an int, then range-checked)
_QUANTITY = re.compile(rf"{_NUMBER}{_SUFFIX}")
_MAX_EXPONENT = 30  # beyond any resource; stops "1e999999999" from building a giant integer
# Digits beyond any resource, too: Python refuses to convert integers of more
# than 4300 digits (a ValueError that is not a QuantityError).
_MAX_NUMBER_CHARS = 100


def parse_quantity(text: object) -> Fraction:
    """The exact value of a quantity string; :class:`QuantityError` if it is not one."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {type(text).__name__} {text!r}")
    match = _QUANTITY.fullmatch(text.strip())
    if match is None or not text.strip():
        raise QuantityError(f"{text!r} is not a quantity")
    if len(match["number"]) > _MAX_NUMBER_CHARS:
        raise QuantityError(f"{text[:20]!r}...: a number of {len(match['number'])} characters is no resource quantity")
    number, suffix = Fraction(match["number"]), match["suffix"]
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    exponent = int(suffix[1:])
    if abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(f"{text!r}: exponent {exponent} is out of range")
    return number * Fraction(10) ** exponent


def quantity_value(text: object) -> int:
    """The quantity rounded up to an integer, like ``Quantity.Value()``."""
    return math.ceil(parse_quantity(text))
