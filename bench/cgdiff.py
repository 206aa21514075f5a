"""``python -m bench cgdiff BASE OTHER [--top N]``: where two callgrind dumps differ, function by function.

Each function's own instructions (self cost: its lines, not its callees'),
summed over its recursion levels' names (``f'2`` is ``f``) and the objects it
is in, in BASE and in OTHER, the N functions whose counts differ most first.
For an outlier run of ``bench callgrind`` (kept with its dumps): the same
phase's dump of a normal run as BASE, the outlier's as OTHER.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def self_costs(path: Path) -> Counter[str]:
    """Each function's own instructions in a callgrind dump (a call line's cost is its callee's: left out)."""
    names: dict[str, str] = {}
    cost: Counter[str] = Counter()
    fn: str | None = None
    call_line = False
    with path.open(errors="replace") as lines:
        for line in lines:
            if call_line:  # the line after ``calls=``: the callee's inclusive cost
                call_line = False
            elif line.startswith(("fn=", "cfn=")):
                ref, _, name = line.split("=", 1)[1].strip().partition(" ")
                if name:
                    names[ref] = name  # (name compression: "(id) name" once, "(id)" after)
                if line.startswith("fn="):
                    fn = names.get(ref, ref).split("'")[0]
            elif line.startswith("calls="):
                call_line = True
            elif fn is not None and (line[:1].isdigit() or line[:1] in "+-*"):
                fields = line.split()
                if len(fields) > 1:
                    cost[fn] += int(fields[1])
    return cost


def differences(base: Counter[str], other: Counter[str], top: int) -> list[tuple[str, int, int]]:
    """(function, base, other), the ``top`` largest differences either way first."""
    names = sorted(set(base) | set(other), key=lambda n: (-abs(other[n] - base[n]), n))
    return [(n, base[n], other[n]) for n in names[:top]]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench cgdiff", description=__doc__.split("\n\n")[0])
    p.add_argument("base", type=Path)
    p.add_argument("other", type=Path)
    p.add_argument("--top", type=int, default=30, help="functions shown [30]")
    a = p.parse_args(argv)
    base, other = self_costs(a.base), self_costs(a.other)
    print(f"{'other - base':>14s} {'base':>14s} {'other':>14s}  function (self cost, instructions)")
    print(f"{sum(other.values()) - sum(base.values()):14,d} {sum(base.values()):14,d} {sum(other.values()):14,d}  (all)")
    for name, b, o in differences(base, other, a.top):
        print(f"{o - b:14,d} {b:14,d} {o:14,d}  {name}")
    return 0
