"""The balloons: which CPUs each owns, which containers it holds, and how it
grows and shrinks as containers come and go.

Synchronous and free of I/O: the hook server calls it under its lock and
applies the resulting cpusets. A balloon's own CPUs are exclusive; its
containers run on those plus, with ``shareIdleCPUsInSame``, the CPUs no
balloon owns in the same scope; a balloon left with no CPU at all runs its
containers on the reserved CPUs (a container always needs somewhere to run).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from . import allocator
from .balloon import Balloon, ContainerKey, Member, cpus_for
from .config import (
    DEFAULT,
    RESERVED,
    BalloonsConfig,
    BalloonType,
)
from .errors import Exhausted, PoolError
from .rebuilding import Rebuilding
from .topology import Topology, format_cpuset

__all__ = ["Exhausted", "Pool", "PoolError"]


class Pool(Rebuilding):
    def __init__(
        self, config: BalloonsConfig, topology: Topology, keep_reserved: frozenset[int] = frozenset(),
        avoid: frozenset[int] = frozenset(), min_balloons: bool = True,
    ) -> None:
        """``keep_reserved``, ``avoid``: a re-plan's reserved CPUs before and CPUs
        containers run on, for reserved CPUs given as a quantity (allocator.reserve).
        ``min_balloons`` False: the minBalloons balloons are made later
        (:meth:`add_min_balloons`), after a rebuild restored the containers:
        made first, they would hold CPUs containers run on."""
        self.config = config
        self.topology = topology
        available = config.available_cpus(topology.all_cpus)
        if config.available_cpuset is not None and not config.available_cpuset <= topology.all_cpus:
            missing = format_cpuset(config.available_cpuset - topology.all_cpus)
            raise PoolError(f"availableResources.cpu: CPUs {missing} are not online on this machine")
        if config.reserved_cpuset is not None:
            if not config.reserved_cpuset <= available:
                raise PoolError(f"reservedResources.cpu: CPUs {format_cpuset(config.reserved_cpuset - available)} are not available on this machine")
            reserved = config.reserved_cpuset
        else:
            count = config.reserved_count
            picked = allocator.reserve(topology, available, count, keep_reserved, avoid)
            if picked is None or len(available) - count < 1:
                raise PoolError(f"reservedResources.cpu: {count} CPUs reserved, but only {len(available)} are available")
            reserved = picked
        self.available = frozenset(available)
        self.reserved = frozenset(reserved)
        self.types = config.types_by_name
        self.balloons: list[Balloon] = [Balloon(self.types[RESERVED], 0, self.reserved, fixed=True)]
        left = len(self.available - self.reserved)
        for btype in config.all_types:
            left -= 0 if btype.name == RESERVED else btype.min_balloons * btype.min_cpus
            if left < 0:
                raise PoolError(
                    f"balloonTypes[{btype.name}]: minBalloons {btype.min_balloons} of minCPUs {btype.min_cpus} "
                    f"do not fit in the {len(self.available - self.reserved)} CPUs outside the reserved set"
                )
        if min_balloons:
            self.add_min_balloons()

    def add_min_balloons(self, avoid: frozenset[int] = frozenset(), had: Iterable[Balloon] = ()) -> None:
        """Balloons up to each type's minBalloons, of minCPUs each (fewer if
        fewer are free: :meth:`grow_short` grows them, after a rebuild's
        containers are placed). ``avoid``: the
        CPUs containers run on (a rebuild's), taken last: an empty balloon's
        were none of them, and idle ones taken move the containers sharing them.
        ``had``: a re-plan's empty balloons before, each made again first, of
        its CPUs still free, while its type is below minBalloons (:meth:`settle`
        and :meth:`grow_short` size it): made anew it could take other CPUs,
        changing the idle CPUs containers share, at a reload of the same
        config too. Each keeps its index, so its name (logs, the status)."""
        names: dict[str, list[int]] = {}  # of those made anew (none of their CPUs free): their indexes
        for old in had:
            btype = self.types.get(old.btype.name)
            kept = old.cpus & self.free
            if btype is None or btype.name == RESERVED or len(self.of_type(btype.name)) >= btype.min_balloons:
                continue
            if not kept:
                names.setdefault(btype.name, []).append(old.index)
                continue
            made = self._new_balloon(btype, 0, index=old.index)
            assert made is not None  # below minBalloons, so below maxBalloons
            made.cpus = kept
        for btype in self.config.all_types:
            while btype.name != RESERVED and len(self.of_type(btype.name)) < btype.min_balloons:
                index = names[btype.name].pop(0) if names.get(btype.name) else None
                made = self._new_balloon(btype, min(btype.min_cpus, len(self.free)), avoid, index)
                assert made is not None  # maxBalloons is at least minBalloons (config.py)

    # -- lookups ------------------------------------------------------------------

    @property
    def free(self) -> frozenset[int]:
        owned = set().union(*(b.cpus for b in self.balloons))
        return self.available - owned

    def members(self) -> Iterator[tuple[Balloon, Member]]:
        for balloon in self.balloons:
            for member in balloon.members.values():
                yield balloon, member

    def balloon_of(self, key: ContainerKey) -> Balloon | None:
        return next((b for b in self.balloons if key in b.members), None)

    def of_type(self, name: str) -> list[Balloon]:
        return [b for b in self.balloons if b.btype.name == name]

    # -- CPUs a container runs on --------------------------------------------------

    def effective_cpus(self, balloon: Balloon) -> frozenset[int]:
        cpus = balloon.cpus
        if scope := balloon.btype.share_idle_cpus_in_same:
            cpus |= self.free & self.topology.scope_cpus(scope, balloon.cpus)
        return cpus or self.reserved

    def effective_mems(self, balloon: Balloon) -> frozenset[int]:
        return self.topology.mems_of(self.effective_cpus(balloon))

    def describe(self, balloon: Balloon) -> str:
        return f'{balloon.name}{{cpus:"{format_cpuset(self.effective_cpus(balloon))}", mems:"{format_cpuset(self.effective_mems(balloon))}"}}'

    # -- changes ------------------------------------------------------------------

    def _new_balloon(self, btype: BalloonType, size: int, avoid: frozenset[int] = frozenset(),
                     index: int | None = None) -> Balloon | None:
        """``index``: a re-plan's, the one the balloon had, kept if no other has it (else the lowest free)."""
        existing = self.of_type(btype.name)
        if not btype.has_room(len(existing)):
            return None
        cpus = allocator.take(self.topology, self.free - avoid, size) if avoid else None
        if cpus is None:
            cpus = allocator.take(self.topology, self.free, size)
        if cpus is None:
            return None
        used = {b.index for b in existing}
        if index is None or index in used:
            index = next(i for i in range(len(used) + 1) if i not in used)
        balloon = Balloon(btype, index, cpus)
        self.balloons.append(balloon)
        return balloon

    def resize(self, balloon: Balloon, extra_milli: int = 0, joining: bool = False) -> bool:
        """Bring the balloon to its target size; False (and no change) if it cannot grow that far."""
        if balloon.fixed:
            return True
        target = balloon.target_size(extra_milli, joining)
        have = len(balloon.cpus)
        if target > have:
            more = allocator.take(self.topology, self.free, target - have, near=balloon.cpus)
            if more is None:
                return False
            balloon.cpus = balloon.cpus | more
        elif target < have:
            balloon.cpus = balloon.cpus - allocator.give_back(self.topology, balloon.cpus, have - target)
        return True

    def _try_join(self, balloon: Balloon, member: Member) -> bool:
        if not balloon.fits(member.milli) or not self.resize(balloon, member.milli, joining=True):
            return False
        balloon.members[member.key] = member
        return True

    def assign(self, member: Member, btype: BalloonType, avoid: frozenset[int] = frozenset()) -> Balloon:
        """Place a new container (a new balloon takes ``avoid`` last); :class:`Exhausted` when no balloon of
        its type can take it."""
        if btype.name == RESERVED:
            reserved = self.balloons[0]
            reserved.members[member.key] = member
            return reserved
        same_pod = [b for b in self.of_type(btype.name) if b.has_pod(member.pod_uid)]
        if same_pod:  # containers of a pod share their balloon
            # Each of a split pod's (assign_anyway split it past maxCPUs), in
            # the pool's order: its first one full, another may hold it.
            home = next((b for b in same_pod if self._try_join(b, member)), None)
            if home is not None:
                return home
            raise Exhausted(self._why(btype, member, same_pod))
        existing = self.of_type(btype.name)
        empty = [b for b in existing if not b.members]
        spare = [b for b in existing if b.members and b.target_size(member.milli, True) <= len(b.cpus) and b.fits(member.milli)]
        growable = [b for b in existing if b.members and b not in spare]
        if btype.prefer_new_balloons:
            order: list[Balloon | None] = [*empty, None, *spare, *growable]
        else:
            order = [*spare, *growable, *empty, None]
        for candidate in order:
            if candidate is None:
                if not btype.holds(member.milli):
                    continue
                size = max(cpus_for(member.milli), btype.min_cpus)
                candidate = self._new_balloon(btype, size, avoid)
                if candidate is None:
                    continue
                candidate.members[member.key] = member
                return candidate
            if self._try_join(candidate, member):
                return candidate
        raise Exhausted(self._why(btype, member, []))

    def assign_fallback(self, member: Member) -> Balloon:
        """The default balloon takes a container that is not refused and that
        no balloon of its type can hold (assign_anyway), grown as far as CPUs
        are free."""
        btype = self.types[DEFAULT]
        balloon = next(iter(self.of_type(DEFAULT)), None)
        if balloon is None:
            balloon = self._new_balloon(btype, max(cpus_for(member.milli), btype.min_cpus)) or self._new_balloon(btype, 0)
        if balloon is None:  # maxBalloons: 0 balloons allowed would be odd, but do not lose the container
            balloon = Balloon(btype, len(self.of_type(DEFAULT)), frozenset())
            self.balloons.append(balloon)
        self._join_short(balloon, member)
        return balloon

    def assign_anyway(self, member: Member, btype: BalloonType) -> Balloon:
        """A container that is not refused: a running one (a rebuild's, one
        reconcile adopts), or any under onExhausted: Ignore. When no balloon
        of its type can take it in full (:meth:`assign`), its pod's, else an
        empty one (a minBalloons balloon left without CPUs), else a new one
        if its type has room for it and a CPU is free (or the default balloon
        has none either; with none free, below maxBalloons, one of its type
        without CPUs: our extension, NRI fails the allocation), takes it,
        grown as far as CPUs are free (later too: :meth:`grow_short`),
        rather than the default balloon (assign_fallback): a pod's containers
        stay together, on CPUs of their type. All within maxCPUs."""
        try:
            return self.assign(member, btype)
        except Exhausted:
            pass
        room = [b for b in self.of_type(btype.name) if b.fits(member.milli)]
        home = next((b for b in room if b.has_pod(member.pod_uid)), None) or next((b for b in room if not b.members), None)
        within = btype.holds(member.milli)
        # A new balloon without a CPU would run it on the reserved ones, where
        # the default balloon has some (and count against maxBalloons).
        if home is None and within and (self.free or not any(b.cpus for b in self.of_type(DEFAULT))):
            if not self.free and not btype.prefer_new_balloons and (
                btype.has_room(len(self.of_type(btype.name)))
            ):  # a new one would have no CPU either: one without any, as a re-plan's restore() joins it
                home = next((b for b in room if not b.cpus), None)
            home = home or self._new_balloon(btype, 0)  # None when its type has no room for another
        if home is None:
            return self.assign_fallback(member)
        self._join_short(home, member)
        return home

    def _join_short(self, balloon: Balloon, member: Member) -> None:
        """``member`` joins ``balloon``, which grows to its target, or as far as CPUs are free."""
        balloon.members[member.key] = member
        self.resize_short(balloon)

    def resize_short(self, balloon: Balloon) -> None:
        """Bring the balloon to its target size, or grow it as far as CPUs are free."""
        if not self.resize(balloon):
            self.take_free(balloon)

    def _why(self, btype: BalloonType, member: Member, pods: list[Balloon]) -> str:
        """``pods``: its pod's balloons, all tried; none: every balloon of its type was."""
        count = len(self.of_type(btype.name))
        limit = f"maxCPUs {btype.max_cpus}" if btype.max_cpus else "no maxCPUs"
        where = (
            f"its pod's balloon{'s' if len(pods) > 1 else ''} {', '.join(b.name for b in pods)}" if pods
            else f"{count} balloon(s) of type {btype.name} (maxBalloons {btype.max_balloons or 'unlimited'}, {limit})"
        )
        return (
            f"no balloon can take container {member.label} ({member.milli}m CPU): {where}; "
            f"{len(self.free)} CPU(s) free"
        )

    def release(self, key: ContainerKey) -> Balloon | None:
        """The container is gone; its balloon shrinks, and goes when empty and above minBalloons."""
        balloon = self.balloon_of(key)
        if balloon is None:
            return None
        del balloon.members[key]
        self.resize(balloon)
        if not balloon.fixed and not balloon.members and len(self.of_type(balloon.btype.name)) > balloon.btype.min_balloons:
            self.balloons.remove(balloon)
        return balloon

    def take_free(self, balloon: Balloon) -> None:
        """Grow ``balloon`` towards its target with as many free CPUs as there are."""
        count = min(balloon.target_size() - len(balloon.cpus), len(self.free))
        more = allocator.take(self.topology, self.free, count, near=balloon.cpus) if count > 0 else None
        if more:  # None only if fewer than count were free, which they are not
            balloon.cpus = balloon.cpus | more

    def grow_short(self, empty: bool = True) -> list[Balloon]:
        """Grow the balloons short of CPUs from those freed since: first those
        whose containers hold fewer than they request (too few were free when
        they were placed or re-planned, and they took those), then empty ones
        below minCPUs (a minBalloons balloon made with too few free, as after a
        restart); in each, those without any CPU first (their containers run
        on the reserved ones). All within maxCPUs. ``empty`` False: empty ones
        do not grow. The balloons grown."""
        short = [b for b in self.balloons if not b.fixed and len(b.cpus) < b.target_size() and (empty or b.members)]
        grown = []
        for balloon in sorted(short, key=lambda b: (not b.members, bool(b.cpus), b.target_size() - len(b.cpus))):
            if not self.free:
                break
            self.take_free(balloon)
            grown.append(balloon)
        return grown
