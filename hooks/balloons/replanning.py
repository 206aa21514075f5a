"""A re-plan (a config reload, hotplug): the containers of a plan, as they
run now, rebuilt on another config or machine, what the plan knows that a
restart does not (each balloon's own CPUs and name, a move refused or
unsure) handed on: what :func:`.restoring.replan` gives
:func:`.restoring.rebuild`, and the order it keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import planning
from .balloon import Balloon, Member
from .config import DEFAULT
from .planning import Restored
from .topology import parse_cpuset

if TYPE_CHECKING:
    from .state import Assignments


def restored(state: Assignments) -> list[Restored]:
    """Every container of ``state`` as it runs now, to rebuild with another
    config (one whose move is unsure as not pinned). One on every CPU of
    this plan's machine is not pinned either: after CPUs came online that
    would no longer be every CPU (what it runs on is still recorded: its balloon's
    cpuset may be every CPU, given again it would be moved to it). Unlike
    a restart's, one not known to run on the balloon it was given (its
    move refused or unsure) goes back to it (``planned``), which the
    rebuild moves it to; so do one on every CPU that is its balloon's
    cpuset and every one under pinCPU: false, whose cpuset names no CPUs
    to find its balloon by."""
    out = []
    for balloon, member in state.pool.members():
        key = member.key
        cpus, mems = state.applied.get(key, ("", "")) if key not in state.unsure else ("", "")
        pinned = everywhere = parse_cpuset(cpus)
        if state.topology.all_cpus <= pinned:
            pinned = frozenset()
        home = key not in state.unsure and state.applied.get(key) == state.target(key)
        # Not known to run on its balloon: its move unsure, or not on its
        # balloon's cpuset (none given, a move refused: put back by the
        # CPUs it runs on, as a restart guesses, it could regroup others).
        astray = key in state.unsure or (not home and state.target(key) != ("", ""))
        # On its balloon's cpuset it goes back to that balloon's own CPUs
        # too: with the idle CPUs of a package, NUMA node or core shared,
        # a cpuset does not tell which they are (a restart's settle guesses).
        back = astray or not state.config.pin_cpu or home
        fresh = Member(key, member.namespace, member.pod_name, member.milli, member.container_id)
        chosen = planning.type_or_default(state.config, state.pods[key])[0].name
        out.append(Restored(
            member=fresh, pod=state.pods[key], cpus=pinned, mems=mems, answers=state.answers.get(key, 0),
            planned=planning.Planned(balloon.btype.name, balloon.cpus - state.pool.reserved, balloon.index)
            if back else None, astray=astray,
            fallback=chosen if balloon.btype.name == DEFAULT != chosen else "", everywhere=everywhere - pinned,
        ))
    return out


def keep_order(before: Sequence[Balloon], after: list[Balloon]) -> None:
    """``after``, a re-plan's balloons, in the order of ``before``'s (placement
    tries them in it, the status lists them in it), matched by name; those
    made new last, as made (the sort is stable)."""
    order = {b.name: n for n, b in enumerate(before)}
    after.sort(key=lambda b: order.get(b.name, len(order)))
