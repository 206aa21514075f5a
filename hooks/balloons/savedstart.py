"""What a restart reads from the stateDir the hook started with: the
reserved CPUs to keep (savedreserved.py) and the balloons to rebuild
(savedplan.py), each with why, for the log: :class:`StartFiles`, held by
:class:`~.savedset.SavedSet`, which writes the files from the rebuild on.

The saved balloons are consulted before the saved reserved set is given up
for what runs (:meth:`StartFiles.restart`): a container on some of the
saved reserved CPUs only (a move left half done when the hook stopped)
contradicts the set, but the balloons saved with it put that container back
in its balloon and move it, as a reload puts back one whose move was
refused; deduced instead, the reserved CPUs would be other ones, and every
balloon rebuilt from the cpusets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from .balloon import ContainerKey
from .config import BalloonsConfig
from .planning import Restored
from .savedplan import PlanFile, SavedPlanError, SavedPlanNewer, rebuild_from
from .savedreserved import AtRestart, ReservedFile, SavedReserved, SavedReservedError, fingerprint, judge
from .state import Assignments
from .topology import Topology, format_cpuset


CPUSETS = "rebuilt from the CPUs the containers run on"  # balloons' why, without saved ones

log = logging.getLogger("hooks.balloons")


@contextmanager
def _held(logger: logging.Logger) -> Iterator[list[logging.LogRecord]]:
    """``logger``'s records of this thread held back (not emitted) while in
    it: the caller replays them (Logger.handle) or drops them. On an
    exception they are replayed before it goes on: lines up to a failure
    are not lost with the trial."""
    held: list[logging.LogRecord] = []
    thread = threading.get_ident()

    def hold(record: logging.LogRecord) -> bool:
        if record.thread != thread:
            return True  # another thread's line: not the trial's
        held.append(record)
        return False

    logger.addFilter(hold)
    try:
        yield held
    except BaseException:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)
        raise
    finally:
        logger.removeFilter(hold)


class BalloonsAtRestart(NamedTuple):
    """The state a restart rebuilt from the saved balloons (None: from the
    cpusets, as without them), and why, for the log."""

    state: Assignments | None
    why: str
    level: int = logging.INFO
    # For the log line's fields: the containers put back in their saved
    # balloon or not, those placed as new, those to move (SavedRestart.fields).
    changes: dict[str, list[str]] | None = None
    # The containers put back in their saved balloon (SavedRestart.put_back's keys).
    put_back: frozenset[ContainerKey] = frozenset()


class _Judged(NamedTuple):
    """What _at_restart read and kept: the verdict, the saved set loaded (None:
    none, or unusable) and, if refused for the containers that contradict
    it, those (key -> label)."""

    kept: AtRestart
    loaded: SavedReserved | None = None
    contradicting: dict[ContainerKey, str] | None = None


class StartFiles:
    """A restart's reading of the files of the stateDir the hook started
    with (``started``, its reserved.json; None: stateDir not set); held by
    SavedSet. reserved.json is read once a restart, by _at_restart."""

    def __init__(self, started: ReservedFile | None) -> None:
        self.started = started

    def restart(self, config: BalloonsConfig, topology: Topology,
                found: list[Restored]) -> tuple[AtRestart, BalloonsAtRestart]:
        """The reserved CPUs to keep (:meth:`_at_restart`) and the balloons
        rebuilt (:meth:`_balloons`), the containers ``found`` running. A
        saved set refused for the containers that contradict it is kept all
        the same when the saved balloons, written with it, fit this restart
        and put each of those back in its balloon (see the module's
        docstring); one they do not hold (a stale or copied stateDir: new pod
        uids) says the set is not theirs: deduced."""
        kept, saved, contradicting = self._at_restart(config, topology, found)
        token = saved.token if saved is not None else None
        if saved is None or contradicting is None:
            return kept, self._balloons(config, topology, found, kept.reserved, token)
        held: list[logging.LogRecord] = []  # a trial: its placements said only if it is kept
        balloons = self._balloons(config, topology, found, saved.cpus, token, held)
        if balloons.state is None:
            refused = balloons
        else:
            left = [label for key, label in contradicting.items() if key not in balloons.put_back]
            if not left:
                for record in held:
                    log.handle(record)
                assert self.started is not None  # saved was read from it
                why = (f"the saved set in {self.started.path}, as the saved balloons written with it name it, "
                       f"which put back the containers found off them (what runs alone: {kept.why})")
                return AtRestart(saved.cpus, why), balloons
            refused = BalloonsAtRestart(None, f"{CPUSETS}: the saved balloons do not put back {', '.join(left)}")
        why = refused.why.removeprefix(f"{CPUSETS}: ")
        return kept._replace(why=f"{kept.why}; nor could the saved balloons keep it: {why}"), refused

    def _at_restart(self, config: BalloonsConfig, topology: Topology, found: list[Restored]) -> _Judged:
        """The reserved CPUs to keep at start-up, the containers ``found``
        running: the set saved in the stateDir the hook started with, if
        consistent with them (:func:`judge`); with what it read (_Judged)."""
        deduced = "deduced from the CPUs the containers run on"
        if self.started is None:
            listed = config.reserved_cpuset is not None
            return _Judged(AtRestart(None, "those reservedResources.cpu lists" if listed else f"{deduced} (stateDir not set: not saved)"))
        where = str(self.started.path)
        saved = None
        try:
            saved = self.started.load()  # removes a killed hook's temporary file, whatever the config
            if config.reserved_cpuset is not None:
                return _Judged(AtRestart(None, "those reservedResources.cpu lists"), saved)
            if saved is None:
                return _Judged(AtRestart(None, f"{deduced}: none saved in {where} (the first start with this stateDir, "
                                               "or the last write failed)"))
            kept = judge(config, topology, found, saved)
        except SavedReservedError as exc:
            contradicting = None
            if saved is not None and exc.containers:
                contradicting = {item.member.key: item.member.label for item in found if item.member.key in exc.containers}
            return _Judged(AtRestart(None, f"{deduced}: the saved set in {where} {exc}", logging.WARNING), saved, contradicting)
        why = f"the saved set in {where}"
        if kept != saved.cpus:
            why += f" (CPUs {format_cpuset(saved.cpus - kept)} of it offline now: topped up as after hotplug)"
        if saved.config != fingerprint(config):
            why += ", saved under another config: kept as a reload of this one keeps them"
        return _Judged(AtRestart(kept, why), saved)

    def _balloons(self, config: BalloonsConfig, topology: Topology, found: list[Restored],
                  reserved: frozenset[int] | None, token: str | None,
                  held: list[logging.LogRecord] | None = None) -> BalloonsAtRestart:
        """The balloons rebuilt from those saved in the stateDir the hook
        started with, with the containers ``found`` running (each put back in
        its saved balloon, those in none placed as new ones), if they fit
        this restart: written with the reserved.json it started with
        (``token``, that of the reserved.json read; None: none usable), the
        reserved CPUs it keeps (``reserved``), the same config, their CPUs
        online (savedplan.rebuild_from); else none, and why. ``held``: a
        trial's, the rebuild's lines are held back in it (for the caller to
        replay or drop); reading the file (its leftover removal) is logged
        whatever the trial's outcome."""
        if self.started is None:
            return BalloonsAtRestart(None, f"{CPUSETS} (stateDir not set: not saved)")
        plans = PlanFile(self.started.path.parent, self.started.node)
        try:
            plan = plans.load()
        except SavedPlanError as exc:
            level = logging.INFO if isinstance(exc, SavedPlanNewer) else logging.WARNING  # a downgrade: expected
            return BalloonsAtRestart(None, f"{CPUSETS}: the saved balloons in {plans.path} {exc}", level)
        if plan is None:
            return BalloonsAtRestart(None, f"{CPUSETS}: none saved in {plans.path} (the first start with this "
                                           "stateDir or this version, or the last write failed)")
        try:
            if not plan.token or plan.token != token:
                raise SavedPlanError(f"were not written with {self.started.path} (a crash between the two writes, "
                                     "or a hook of an earlier version ran since)")
            if config.reserved_cpuset is None and reserved != plan.reserved:
                kept = format_cpuset(reserved) if reserved is not None else "those deduced"
                raise SavedPlanError(f"names reserved CPUs {format_cpuset(plan.reserved)}, the restart keeps {kept}")
            if held is None:
                restart = rebuild_from(config, topology, found, plan)
            else:
                with _held(log) as lines:
                    try:
                        restart = rebuild_from(config, topology, found, plan)
                    except SavedPlanError:
                        lines.clear()  # refused: the trial's lines dropped, not replayed as a failure's
                        raise
                held.extend(lines)
        except SavedPlanError as exc:
            return BalloonsAtRestart(None, f"{CPUSETS}: the saved balloons in {plans.path} {exc}")
        changes = restart.summary()
        return BalloonsAtRestart(restart.state, f"the saved balloons in {plans.path}" + (f" ({changes})" if changes else ""),
                                 changes=restart.fields(), put_back=frozenset(restart.put_back))
