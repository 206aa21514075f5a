"""Which running containers must be moved, and what a move's outcome says
they run on: the cpuset each container was last given, those whose last
move ended without an answer, and how many cpusets each was given (a move
that went through this hook's PreUpdateContainerResources was answered
there). A mixin of :class:`~.state.Assignments`, which holds the tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from .balloon import ContainerKey
from .config import BalloonsConfig
from .pool import Pool
from .topology import format_cpuset

Cpuset = tuple[str, str]  # (cpuset_cpus, cpuset_mems) as the runtime takes them


@dataclass(frozen=True)
class Move:
    """A running container whose balloon changed."""

    key: ContainerKey
    container_id: str
    label: str
    balloon: str
    cpuset: Cpuset
    was: Cpuset | None  # what it was given before: what it still runs on if the move fails
    answers: int = 0  # how many cpusets the hook had given the container when the move was planned


class MoveBook:
    """Moves due and their outcomes; :class:`~.state.Assignments` sets these."""

    config: BalloonsConfig
    pool: Pool
    applied: dict[ContainerKey, Cpuset]  # what each container was last given
    # Containers whose last move ended without an answer (a timeout, a lost
    # connection): the runtime may have applied it or not, so what they run
    # on is not known until a move succeeds (sent again at every retry).
    unsure: set[ContainerKey]
    # How many cpusets each container was given (``given``): a move whose
    # count changed meanwhile went through a PreUpdate that answered for it.
    answers: dict[ContainerKey, int]

    # -- what a container should run on -----------------------------------------------

    def target(self, key: ContainerKey) -> Cpuset | None:
        balloon = self.pool.balloon_of(key)
        if balloon is None:
            return None
        cpus = format_cpuset(self.pool.effective_cpus(balloon)) if self.config.pin_cpu else ""
        mems = format_cpuset(self.pool.effective_mems(balloon)) if self.config.pin_memory else ""
        return cpus, mems

    def moves(self) -> list[Move]:
        """Containers with an id whose balloon's CPUs are no longer what they were
        given, or whose last move's outcome is unknown."""
        out = []
        for balloon, member in self.pool.members():
            target = self.target(member.key)
            due = target != self.applied.get(member.key) or member.key in self.unsure
            if member.container_id and due and target != ("", ""):
                out.append(Move(
                    member.key, member.container_id, member.label, balloon.name, target,  # type: ignore[arg-type]  # a member's: not None
                    self.applied.get(member.key), self.answers.get(member.key, 0),
                ))
        return out

    def _current(self, move: Move) -> bool:
        """``move``'s container is still the member's (not gone, not another attempt now)."""
        balloon = self.pool.balloon_of(move.key)
        return balloon is not None and balloon.members[move.key].container_id == move.container_id

    def moved(self, move: Move) -> None:
        """The runtime applied ``move``."""
        if not self._current(move):
            return
        self.unsure.discard(move.key)
        if self.answers.get(move.key, 0) == move.answers:
            # No PreUpdate answered for it meanwhile (the runtime was called
            # straight, not through the proxy): it runs on what was sent, the
            # target or not, so a balloon that changed back moves it again.
            # (Through the proxy it runs on what PreUpdate answered, recorded then.)
            self.given(move.key, move.cpuset)

    def not_moved(self, move: Move) -> None:
        """The runtime refused ``move``: the container still runs on what it had.
        Through the proxy this hook's PreUpdateContainerResources took the move
        for given before the runtime failed it; left so, no retry would move it.
        (One already unsure stays so: ``was`` is not known to be what it runs on.)"""
        if not self._current(move) or move.key in self.unsure:
            return
        if move.was is None:
            self.applied.pop(move.key, None)
        else:
            self.applied[move.key] = move.was

    def maybe_moved(self, move: Move) -> None:
        """``move`` ended without an answer: the runtime may have applied it, so
        ``was`` is not restored; moves() sends it again until one succeeds."""
        if self._current(move):
            self.unsure.add(move.key)

    def given(self, key: ContainerKey, cpuset: Cpuset) -> None:
        self.applied[key] = cpuset
        self.answers[key] = self.answers.get(key, 0) + 1
