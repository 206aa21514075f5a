"""How a rebuild (a restart, a reload, hotplug) puts the balloons back: a
container found running rejoins a balloon of its type by the CPUs it runs
on (:meth:`Rebuilding.restore`), one its type had no room for goes back to
its type if it can now (:meth:`Rebuilding.rehome`), and every balloon is
then sized to its requests (:meth:`Rebuilding.settle`). A mixin of
:class:`~.pool.Pool`, whose balloons it changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .balloon import Balloon, ContainerKey, Member, cpus_for
from .config import DEFAULT, RESERVED, BalloonType
from .errors import Exhausted

if TYPE_CHECKING:
    from .pool import Pool


class Rebuilding:
    def restore(self: Pool, member: Member, btype: BalloonType, cpus: frozenset[int],  # type: ignore[misc]  # a mixin of Pool: mypy wants self a supertype
                mates: frozenset[ContainerKey] | None = None, index: int | None = None) -> Balloon | None:
        """Put back a container found running on ``cpus`` (after a restart or a config reload;
        idle CPUs it shares with other balloons' containers taken out, restoring.py).

        It rejoins the balloon of its type that holds its pod, or that shares its CPUs, if it has room for it
        (maxCPUs, but in the default balloon, which holds fallbacks beyond them: assign_fallback; for
        preferNewBalloons types, another pod's only if it cannot have a balloon of its own: its type has no room for
        one, or no balloon is left to hold its CPUs: assign() put it there so); a container on the reserved CPUs
        alone was in a balloon without CPUs. Shared CPUs alone say little: with shareIdleCPUsInSame every container
        runs on the same idle ones. Otherwise it gets a new balloon made of its CPUs that no other balloon owns;
        when its type has no room for another balloon, or it asks more than maxCPUs (but in the default type), or
        other balloons own all its CPUs, None: it is placed anew, as a container not pinned yet (it may have run on
        the fallback balloon, or apart from its pod: assign_anyway). :meth:`settle` then resizes everything.
        ``mates``, ``index``: a re-plan's, its old balloon's containers and index. It joins their balloon, else
        makes one of its own again under that index (own CPUs free, or none left) while its type has room, rather
        than its pod's balloon or one sharing its CPUs, which would merge a pod a placement split (its pod's balloon
        was full then: assign_anyway) at a reload of the same config too. With no own CPU left and no room, it joins
        only its mates.
        """
        if btype.name == RESERVED:
            return self.assign(member, btype)
        own = cpus - self.reserved
        existing = self.of_type(btype.name)
        room = btype.has_room(len(existing))
        alone = btype.prefer_new_balloons and room and (not own or bool(own & self.free))
        bounded = btype.name != DEFAULT
        if mates is not None:
            again = next((b for b in existing if mates & b.members.keys()), None)
            within = not bounded or btype.holds(member.milli)
            if again is None and within and room and (not own or own & self.free):
                again = self._new_balloon(btype, 0, index=index)
            if again is not None and (not bounded or again.fits(member.milli)):
                again.cpus |= own & self.free
                again.members[member.key] = member
                return again

        def together(balloon: Balloon) -> bool:
            if bounded and not balloon.fits(member.milli):
                return False
            if balloon.has_pod(member.pod_uid):
                return True
            if mates is not None and not own:  # a re-plan's, with no own CPUs left: its balloon's mates only
                return bool(mates & balloon.members.keys())
            if alone and balloon.members:
                return False
            return bool(balloon.cpus & own) if own else not balloon.cpus

        match = next((b for b in existing if b.has_pod(member.pod_uid) and together(b)), None)
        match = match or next((b for b in existing if together(b)), None)
        if match is None and existing and not btype.has_room(len(existing)):
            return None
        if match is None and bounded and not btype.holds(member.milli):
            return None  # no balloon of its type can hold it (assign_anyway: the default one)
        if match is None and own and not own & self.free:
            return None  # its CPUs are another balloon's (it ran on the default one): none would be its
        if match is None:
            match = self._new_balloon(btype, 0, index=index)
            assert match is not None  # no CPUs asked, and there is room for another balloon
        match.cpus |= own & self.free
        match.members[member.key] = member
        return match

    def rehome(self: Pool, key: ContainerKey, btype: BalloonType) -> Balloon:  # type: ignore[misc]  # a mixin of Pool: mypy wants self a supertype
        """A container a re-plan put back in the default balloon that its type
        ``btype`` could not take: a balloon of its type takes it if it can in
        full now (:meth:`assign`: from the CPUs free, those it runs on first,
        its balloon freeing them; its pod's balloon of that type past maxCPUs
        with it, :meth:`_apart`), else it stays. Its balloon, which goes when
        left empty."""
        balloon = self.balloon_of(key)
        assert balloon is not None
        member = balloon.members.pop(key)
        before = balloon.cpus
        self.resize(balloon)
        try:
            home = self.assign(member, btype, avoid=self.free - before)
        except Exhausted:
            apart = self._apart(member, btype, avoid=self.free - before)
            if apart is None:
                balloon.cpus, balloon.members[key] = before, member
                return balloon
            home = apart
        if not balloon.members and len(self.of_type(balloon.btype.name)) > balloon.btype.min_balloons:
            self.balloons.remove(balloon)  # the default balloon: not fixed
        return home

    def _apart(self: Pool, member: Member, btype: BalloonType, avoid: frozenset[int]) -> Balloon | None:  # type: ignore[misc]  # a mixin of Pool: mypy wants self a supertype
        """For a container its pod's balloons of ``btype`` cannot take
        (:meth:`assign` refused it, trying each of them): a balloon of
        ``btype`` apart from them that takes it in full, when none of them
        holds it within maxCPUs: an empty one, else a new one (taking
        ``avoid`` last); None if none can, or if one of its pod's balloons
        holds it within maxCPUs, unable to grow.

        As :meth:`~.pool.Pool.assign_anyway` places a running container or
        one under onExhausted: Ignore, which splits a pod only past maxCPUs:
        within them it joins its pod's balloon short, grown as far as CPUs
        are free. This container runs in the default balloon already and
        moves only into whole CPUs: it stays there rather than join its
        pod's balloon short, or any balloon that would hold it short
        (assign_anyway joins one, or makes one without CPUs, rather than use
        the default balloon)."""
        pods = [b for b in self.of_type(btype.name) if b.has_pod(member.pod_uid)]
        if not pods:
            return None  # assign tried every balloon
        # assign tried each of its pod's balloons: one that holds it within
        # maxCPUs is its home, as assign_anyway's, though it cannot grow for it now.
        if any(b.fits(member.milli) for b in pods):
            return None  # its pod's can hold it once CPUs are free
        home = next((b for b in self.of_type(btype.name) if not b.members and self._try_join(b, member)), None)
        if home is None and btype.holds(member.milli):
            home = self._new_balloon(btype, max(cpus_for(member.milli), btype.min_cpus), avoid)
            if home is not None:
                home.members[member.key] = member
        return home

    def settle(self: Pool) -> list[str]:  # type: ignore[misc]  # a mixin of Pool: mypy wants self a supertype
        """Resize every balloon to its target (shrinks first, so growth finds
        the CPUs; then those with containers and no CPU, which run on the
        reserved ones, as in :meth:`grow_short`), but an empty one short of
        minCPUs, which a rebuild grows only after it placed its containers
        (:meth:`grow_short`); problems found."""
        problems = []

        def turn(balloon: Balloon) -> tuple[bool, bool, int]:
            short = balloon.target_size() - len(balloon.cpus)
            return short > 0, bool(balloon.cpus) or not balloon.members, short

        for balloon in sorted(self.balloons, key=turn):
            if not balloon.members and len(balloon.cpus) < balloon.target_size():
                continue
            if not self.resize(balloon):
                # Running containers cannot be refused: the balloon takes what is free.
                self.take_free(balloon)
                problems.append(f"{balloon.name} needs {balloon.target_size()} CPUs but holds {len(balloon.cpus)}: too few free")
        return problems
