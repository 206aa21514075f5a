"""A re-plan (a config reload, hotplug): the containers of a plan, as they
run now, rebuilt on another config or machine, what the plan knows that a
restart does not (each balloon's own CPUs and name, a move refused or
unsure) handed on. A mixin of :class:`~.state.Assignments`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import planning
from .balloon import Member
from .config import DEFAULT, BalloonsConfig
from .planning import Restored
from .topology import Topology, parse_cpuset

if TYPE_CHECKING:
    from .state import Assignments


class Replanning:
    def replan(self: Assignments, config: BalloonsConfig, topology: Topology) -> Assignments:
        """These containers, as they run now, on another config (a reload) or
        machine (hotplug): rebuilt, the reserved CPUs kept (see rebuild). PoolError.
        The balloons keep their names and order (placement tries them in it).
        A container in the default balloon because its type had no room for
        it goes into a balloon of its type only if the config changed:
        placement leaves it there while it runs, whatever CPUs are freed, and
        so does a reload of the same config, or hotplug."""
        empty = [b for b in self.pool.balloons if not b.members and not b.fixed]
        state = type(self).rebuild(config, topology, self.restored(), self.pool.reserved, empty,
                                    rehome=not config.plans_as(self.config))
        order = {b.name: n for n, b in enumerate(self.pool.balloons)}
        state.pool.balloons.sort(key=lambda b: order.get(b.name, len(order)))  # stable: new ones last, as made
        return state

    def restored(self: Assignments) -> list[Restored]:
        """Every container as it runs now, to rebuild with another config (one
        whose move is unsure as not pinned). One on every CPU of this plan's
        machine is not pinned either: after CPUs came online that would no
        longer be every CPU (what it runs on is still recorded: its balloon's
        cpuset may be every CPU, given again it would be moved to it). Unlike
        a restart's, one not known to run on the balloon it was given (its
        move refused or unsure) goes back to it (``planned``), which the
        rebuild moves it to; so do one on every CPU that is its balloon's
        cpuset and every one under pinCPU: false, whose cpuset names no CPUs
        to find its balloon by."""
        out = []
        for balloon, member in self.pool.members():
            key = member.key
            cpus, mems = self.applied.get(key, ("", "")) if key not in self.unsure else ("", "")
            pinned = everywhere = parse_cpuset(cpus)
            if self.topology.all_cpus <= pinned:
                pinned = frozenset()
            home = key not in self.unsure and self.applied.get(key) == self.target(key)
            # Not known to run on its balloon: its move unsure, or not on its
            # balloon's cpuset (none given, a move refused: put back by the
            # CPUs it runs on, as a restart guesses, it could regroup others).
            astray = key in self.unsure or (not home and self.target(key) != ("", ""))
            # On its balloon's cpuset it goes back to that balloon's own CPUs
            # too: with the idle CPUs of a package, NUMA node or core shared,
            # a cpuset does not tell which they are (a restart's settle guesses).
            back = astray or not self.config.pin_cpu or home
            fresh = Member(key, member.namespace, member.pod_name, member.milli, member.container_id)
            chosen = planning.type_or_default(self.config, self.pods[key])[0].name
            out.append(Restored(
                member=fresh, pod=self.pods[key], cpus=pinned, mems=mems, answers=self.answers.get(key, 0),
                planned=planning.Planned(balloon.btype.name, balloon.cpus - self.pool.reserved, balloon.name, balloon.index)
                if back else None, astray=astray,
                fallback=chosen if balloon.btype.name == DEFAULT != chosen else "", everywhere=everywhere - pinned,
            ))
        return out
