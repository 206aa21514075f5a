"""A value as a message shows it: cut short, never built out in full.

A YAML value may be small to write and huge to print: nine aliases of nine
aliases, a few levels deep (a billion laughs), is a few hundred bytes of
config and gigabytes of repr. A config error names the value it refuses
through :func:`shown` alone: a few levels, a few items, strings cut.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["shown"]

_REPR = reprlib.Repr()  # its settings as attributes: keywords only from Python 3.12
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 4
_REPR.maxarray = 4
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = 80


def shown(value: Any) -> str:
    """``repr(value)``, at most two levels deep, four items a level, 80 characters a string."""
    return _REPR.repr(value)
