"""The hook's view of the node: the balloon pool, each container's pod
context, and the cpuset each container was last given, so that it knows
which running containers must be moved after a balloon changed (:mod:`.moves`).

The rebuild (after a restart, or with a reloaded config) from what the
containers run on now is :mod:`.restoring`'s, which builds new Assignments.
Synchronous; the server holds its lock around it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from . import planning
from .balloon import Balloon, ContainerKey, Member, milli_from_shares
from .config import BalloonsConfig, PodContext
from .moves import Cpuset, MoveBook
from .planning import Restored
from .pool import Exhausted, Pool
from .runtime import ExitedContainer, Listing
from .topology import Topology, format_cpuset, parse_cpuset

log = logging.getLogger("hooks.balloons")


class Assignments(MoveBook):
    def __init__(
        self, config: BalloonsConfig, topology: Topology, keep_reserved: frozenset[int] = frozenset(),
        avoid: frozenset[int] = frozenset(), min_balloons: bool = True,
    ) -> None:
        self.config = config
        self.topology = topology
        self.pool = Pool(config, topology, keep_reserved, avoid, min_balloons)
        self.pods: dict[ContainerKey, PodContext] = {}
        self.applied: dict[ContainerKey, Cpuset] = {}  # see MoveBook
        self.unsure: set[ContainerKey] = set()
        self.answers: dict[ContainerKey, int] = {}
        self.placed_at: dict[ContainerKey, float] = {}

    # -- changes ----------------------------------------------------------------------

    def record_placed(self, item: Restored) -> None:
        """A container found running, placed by a rebuild (restoring.py):
        its pod, when, and what it runs on, when known: it is moved only if
        its balloon's cpuset differs. Under pinCPU: false a cpuset names no
        CPUs, and its memory nodes alone say it (else every re-plan moved
        every container)."""
        key = item.member.key
        self.pods[key] = item.pod
        self.placed_at[key] = time.monotonic()
        cpus = item.cpus or item.everywhere
        if cpus or (not self.config.pin_cpu and item.mems):
            self.applied[key] = self._running(cpus, item.mems)

    def place(self, member: Member, pod: PodContext, running: bool = False) -> tuple[Balloon, bool]:
        """Assign a container; (balloon, True) when its type could not take it
        in full, under onExhausted: Ignore or ``running`` (a container found
        running, which cannot be refused): in its pod's or an empty balloon of
        its type, short of CPUs, or else in the default balloon (Pool.assign_anyway).
        Raises Exhausted (onExhausted: Fail) or UnknownBalloonType (not ``running``:
        then the default balloon's type)."""
        previous = self.pool.balloon_of(member.key)
        if previous is not None:  # a new attempt of a container whose stop we did not see
            self.pool.release(member.key)
            self.unsure.discard(member.key)
        btype, unknown = planning.type_or_default(self.config, pod)
        if unknown is not None:
            if not running:
                raise unknown
            log.warning("%s; placing %s in the default balloon", unknown, member.label, extra={"container": member.label})
        before = self._sizes()
        fallback = False
        try:
            balloon = self.pool.assign(member, btype)
        except Exhausted:
            if self.config.on_exhausted == "Fail" and not running:
                raise  # the previous attempt's CPUs stay free: the caller may retry (server.py)
            balloon, fallback = self.pool.assign_anyway(member, btype), True
        if previous is not None:  # after the new attempt took what it needs of its CPUs
            self._grow_short()
        self.pods[member.key] = pod
        self.placed_at[member.key] = time.monotonic()
        self._log_resizes(before)
        return balloon, fallback

    def release(self, key: ContainerKey, container_id: str = "", why: str = "", grow: bool = True) -> Balloon | None:
        """``grow`` False: the CPUs freed stay free (for a placement retried
        next, which then calls :meth:`grow_short`), short balloons do not grow."""
        balloon = self.pool.balloon_of(key)
        if balloon is None:
            return None
        member = balloon.members[key]
        if container_id and member.container_id and member.container_id != container_id:
            return None  # an older attempt's stop: the key belongs to its successor now
        before = self._sizes()
        self.pool.release(key)
        for table in (self.pods, self.applied, self.placed_at, self.answers):
            table.pop(key, None)
        self.unsure.discard(key)
        log.info(
            "releasing container %s from balloon %s%s",
            member.label,
            balloon.name,
            f" ({why})" if why else "",
            extra={"container": member.label, "container_id": member.container_id, "balloon": balloon.name,
                   **({"reason": why} if why else {})},
        )
        if grow:
            self._grow_short()
        self._log_resizes(before)
        return balloon

    def release_pod(self, pod_uid: str) -> None:
        for _, member in list(self.pool.members()):
            if member.pod_uid == pod_uid:
                self.release(member.key)

    def resize(self, key: ContainerKey, milli: int) -> bool:
        """A container's request changed (in-place resize); False if its balloon
        cannot grow to it: then the request stands as it was, except under
        onExhausted: Ignore within maxCPUs, where it is taken and the balloon
        takes the CPUs free (growing later as a short balloon does)."""
        balloon = self.pool.balloon_of(key)
        if balloon is None or balloon.members[key].milli == milli:
            return True
        member = balloon.members[key]
        old, target = member.milli, balloon.target_size()
        before = self._sizes()
        member.milli = milli
        met = True
        if milli < old or (balloon.fits(0) and balloon.target_size() <= target):
            # Always taken: a lower request, or a higher one within maxCPUs that
            # needs no more CPUs than the balloon's target (capped at maxCPUs)
            # (a balloon short of CPUs may still be short of it: it shrinks, or
            # takes what is free); the CPUs it gives back go to those short.
            self.pool.resize_short(balloon)
            self._grow_short()
        elif not balloon.fits(0) or not self.pool.resize(balloon):
            met = False
            if self.config.on_exhausted == "Ignore" and balloon.fits(0):
                self.pool.take_free(balloon)  # the resize above failed, changing nothing: no retry of it
            else:
                member.milli = old
        self._log_resizes(before)
        return met

    def release_exited(
        self, live: Iterable[ContainerKey], exited: Iterable[ExitedContainer], pod_uid: str | None = None,
        grow: bool = True,
    ) -> bool:
        """Release the members (only ``pod_uid``'s, if given) whose known
        container the runtime lists as exited with nothing live under their
        name: an init container that finished, a crash waiting for its
        restart (kubelet keeps them, no stop event comes). A member whose id
        is unknown or another one is being re-created. True if any was.
        ``grow``: as :meth:`release`'s."""
        live = set(live)
        gone = {(container.key, container.container_id) for container in exited}
        released = False
        for _, member in list(self.pool.members()):
            if pod_uid is not None and member.pod_uid != pod_uid:
                continue
            if member.container_id and member.key not in live and (member.key, member.container_id) in gone:
                self.release(member.key, member.container_id, why="it exited", grow=grow)
                released = True
        return released

    def reconcile(self, listing: Listing, now: float, grace: float) -> None:
        """Release what the runtime no longer runs (exited at once, unlisted
        after ``grace`` since placement), learn ids, adopt live containers
        this state does not know."""
        found = {f.key: f for f in listing.live}
        self.release_exited(found, listing.exited)
        for _, member in list(self.pool.members()):
            live = found.get(member.key)
            if live is None:
                if now - self.placed_at.get(member.key, 0.0) > grace:
                    self.release(member.key, why="the runtime does not list it")
            else:
                member.container_id = live.container_id
                # What it runs on, as the runtime says: an answer the proxy dropped
                # (a timeout under Ignore) or a failed move leaves it elsewhere
                # than it was given; recorded so, moves() moves it again. Without
                # a spec the runtime does not say: the record stands (taken for
                # "not pinned", it would be moved at every pass).
                if not live.spec_known:
                    continue
                running = self._running(live.cpus, live.mems)
                if member.key in self.applied:
                    self.applied[member.key] = running
        # As a restart places those its saved balloons do not hold: by creation, not listing, order.
        # Those not known only (adopting one places no other), then sorted: not every live one each pass.
        unknown = [live for live in found.values() if self.pool.balloon_of(live.key) is None]
        for live in sorted(unknown, key=lambda f: planning.creation_order(f.created_at, f.container_id)):
            member = Member(live.key, live.pod.namespace, live.pod.pod_name, milli_from_shares(live.shares), live.container_id)
            spec = live.spec_known  # else cpus and mems say nothing of what it runs on
            self.adopt(member, live.pod, live.cpus if spec else frozenset(), live.mems if spec else "")

    def adopt(self, member: Member, pod: PodContext, cpus: frozenset[int], mems: str) -> Balloon:
        """A running container this state does not know, placed by its type
        as a new one (not refused: ``place(running=True)``), running on
        ``cpus`` and ``mems`` (empty: not known), moved only if not on its
        balloon's cpuset already (under pinCPU: false its memory nodes alone
        say it, as record_placed's). Reconcile's, and a restart's from the
        saved balloons for one they do not hold (savedplan.rebuild_from). Its balloon."""
        balloon, short = self.place(member, pod, running=True)
        if cpus or (not self.config.pin_cpu and mems):
            self.applied[member.key] = self._running(cpus, mems)
        log.info("adopting running container %s into balloon %s%s", member.label, self.pool.describe(balloon),
                 " (its balloon type cannot take it in full)" if short else "",
                 extra={"container": member.label, "balloon": balloon.name, "fallback": short})
        return balloon

    def _running(self, cpus: frozenset[int], mems: str) -> Cpuset:
        """A cpuset read from a container's spec, as target() writes it (the
        spec may say "0,1" for "0-1"), so that only a real difference moves it."""
        try:
            mems = format_cpuset(parse_cpuset(mems))
        except ValueError:
            pass  # compared as it is: a move writes a valid one
        return (format_cpuset(cpus) if self.config.pin_cpu else "", mems if self.config.pin_memory else "")

    def members_of_pod(self, pod_uid: str) -> list[Member]:
        return [m for _, m in self.pool.members() if m.pod_uid == pod_uid]

    def grow_short(self) -> None:
        """:meth:`_grow_short`, logged: after a placement retried (server.py)."""
        before = self._sizes()
        self._grow_short()
        self._log_resizes(before)

    def _grow_short(self) -> None:
        """CPUs were freed: balloons left short of them grow (Pool.grow_short),
        their running containers moved by moves()."""
        for balloon in self.pool.grow_short():
            log.info(
                "balloon %s grows from the CPUs free now to %d of the %d CPUs %s",
                self.pool.describe(balloon), len(balloon.cpus), balloon.target_size(),
                "its containers request" if balloon.members else "of its minCPUs",
                extra={"balloon": balloon.name, "cpus": format_cpuset(balloon.cpus), "target_cpus": balloon.target_size()},
            )

    # -- logging -------------------------------------------------------------------------

    def _sizes(self) -> dict[str, frozenset[int]]:
        return {b.name: self.pool.effective_cpus(b) for b in self.pool.balloons}

    def _log_resizes(self, before: dict[str, frozenset[int]]) -> None:
        for balloon in self.pool.balloons:
            old = before.get(balloon.name)
            new = self.pool.effective_cpus(balloon)
            if old is None:
                log.info("balloon %s created", self.pool.describe(balloon), extra={"balloon": balloon.name, "cpus": format_cpuset(new)})
            elif old != new:
                log.info(
                    'balloon %s changes cpus from "%s" to "%s"',
                    balloon.name,
                    format_cpuset(old),
                    format_cpuset(new),
                    extra={"balloon": balloon.name, "cpus": format_cpuset(new), "previous_cpus": format_cpuset(old)},
                )
        names = {b.name for b in self.pool.balloons}
        for name in before:
            if name not in names:
                log.info("balloon %s removed (empty)", name, extra={"balloon": name})
