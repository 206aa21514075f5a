"""The hook's saved reserved set and balloons (``stateDir``): read at start, written by one writer.

A restart reads the file in the stateDir the hook started with
(:meth:`SavedSet.at_restart`), whatever a reload before the start-up
rebuild set: that file is what the hook before it wrote. From the rebuild
on, :meth:`SavedSet.record` notes the reserved set and the config in force,
in the stateDir of that config, and returns at once: no file I/O on the
event loop, so no hook call (a hotplug noticed at PreCreateContainer
records) waits on a slow disk. One writer (:meth:`SavedSet.run`, a task of
the hook's background work) writes, in a thread, the latest set noted, one
write at a time: a set noted while a write runs is written after it, so an
older set never lands last, and the file is behind what the hook runs on
only while a write is due or runs. A failed write removes the file (a
restart then deduces, rather than keep a set no longer true) and is tried
again at the next record() of a reconcile pass, logged once per set and
error. Leaving a directory (a reload moves or clears stateDir) removes the
file there: a later start naming that directory again would trust a set
this hook no longer keeps.

The hook's stop ends the writer with :meth:`SavedSet.finish`, after its
server stopped and before its socket's lock goes (``HookServer._before_release``):
the set due is written, waited for up to ``STOP_WRITE_WAIT``; past that,
the set still waiting is dropped. A write already in its thread cannot be
stopped (a stalled disk may hold it for good): finish() does not wait for
it but hands it back, and the SDK keeps the socket's lock until it has
ended (``hooks.releasestep``), so that no write of this hook lands after the
next instance, waiting on the lock, has read the file or written its own;
the stop itself ends. What an operator sees then: the warning below, then
the SDK's "keeps its socket's lock until a write it cannot cut has ended";
the process does not exit before the write ends (asyncio.run joins the
default executor's threads as it closes; the lock waits on the executor's
own future, which its cancel of the tasks left does not touch), and
a next instance waits on the lock and is refused past its wait, naming this
pid. The write is atomic (``hooks.statefile.write_atomic``: a temporary
file renamed into place), so however late it lands it never tears the file.
From then on nothing is written.

The balloons (savedplan.py) are noted with the set, on every change of the
plan (each hook call under the lock), and written by the same writer in the
same thread call, after the set: ``balloons.json`` names the reserved CPUs
too, so a restart after a crash between the two writes sees they differ. A
failed write removes both files; leaving a directory removes both.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .config import BalloonsConfig
from .planning import Restored
from .state import Assignments
from .savedplan import PlanFile, SavedPlan, SavedPlanError, rebuild_from
from .savedreserved import AtRestart, ReservedFile, SavedReserved, SavedReservedError, fingerprint, judge
from .topology import Topology, format_cpuset

log = logging.getLogger("hooks.balloons")

# How long a stopping hook waits for the set due to be written before it
# drops it (a write already in its thread keeps the socket's lock: finish()).
STOP_WRITE_WAIT = 2.0

class Wanted(NamedTuple):
    """A set (and the balloons) to write, and where (None: stateDir off, the files left)."""

    directory: Path | None
    saved: SavedReserved
    plan: SavedPlan | None = None


class BalloonsAtRestart(NamedTuple):
    """The state a restart rebuilt from the saved balloons (None: from the
    cpusets, as without them), and why, for the log."""

    state: Assignments | None
    why: str
    level: int = logging.INFO


def _save(reserved: ReservedFile, plan: PlanFile, saved: SavedReserved, balloons: SavedPlan | None) -> None:
    """In a thread: the set, then the balloons (none: the file removed), each atomically (OSError)."""
    reserved.save(saved)
    if balloons is None:
        plan.remove()
    else:
        plan.save(balloons)


def _remove(reserved: ReservedFile, plan: PlanFile) -> None:
    """In a thread: both files (OSError)."""
    try:
        reserved.remove()
    finally:
        plan.remove()


def _retrieved(write: asyncio.Future[Any]) -> None:
    if not write.cancelled():
        write.exception()


class SavedSet:
    def __init__(self, state_dir: str) -> None:
        # The file a restart reads: that of the stateDir the hook started with.
        self.started = ReservedFile(Path(state_dir)) if state_dir else None
        # The file this hook holds (writes, or the run before it wrote):
        # removed when a reload leaves its directory.
        self._held = self.started
        self._wanted: Wanted | None = None  # the latest set noted
        self._generation = 0  # of _wanted: a write of an older one is followed by another
        self._written_generation = 0
        self._failed: tuple[str, int | None, str | None] | None = None  # (set, errno, strerror), logged once
        self._due = asyncio.Event()
        self._writing = asyncio.Lock()  # one writer
        # A thread's write, which a cancel does not stop: the executor's own
        # future, no Task: asyncio.run's end cancels every task left, and a
        # Task cancelled so would say the write ended while it still runs.
        self._in_flight: asyncio.Future[Any] | None = None
        self._finished = False  # finish() ran: nothing is written any more
        self._logged: tuple[Path, SavedReserved] | None = None  # the set last logged as saved, and where

    def at_restart(self, config: BalloonsConfig, topology: Topology, found: list[Restored]) -> AtRestart:
        """The reserved CPUs to keep at start-up, the containers ``found``
        running: the set saved in the stateDir the hook started with, if
        consistent with them (:func:`judge`)."""
        deduced = "deduced from the CPUs the containers run on"
        if self.started is None:
            listed = config.reserved_cpuset is not None
            return AtRestart(None, "those reservedResources.cpu lists" if listed else f"{deduced} (stateDir not set: not saved)")
        where = str(self.started.path)
        try:
            saved = self.started.load()  # removes a killed hook's temporary file, whatever the config
            if config.reserved_cpuset is not None:
                return AtRestart(None, "those reservedResources.cpu lists")
            if saved is None:
                return AtRestart(None, f"{deduced}: none saved in {where} (the first start with this stateDir, or the last write failed)")
            kept = judge(config, topology, found, saved)
        except SavedReservedError as exc:
            return AtRestart(None, f"{deduced}: the saved set in {where} {exc}", logging.WARNING)
        why = f"the saved set in {where}"
        if kept != saved.cpus:
            why += f" (CPUs {format_cpuset(saved.cpus - kept)} of it offline now: topped up as after hotplug)"
        if saved.config != fingerprint(config):
            why += ", saved under another config: kept as a reload of this one keeps them"
        return AtRestart(kept, why)

    def balloons_at_restart(self, config: BalloonsConfig, topology: Topology, found: list[Restored],
                            reserved: frozenset[int] | None) -> BalloonsAtRestart:
        """The balloons rebuilt from those saved in the stateDir the hook
        started with, if they agree with the containers ``found`` running
        and the reserved CPUs the restart keeps (``reserved``: at_restart's;
        savedplan.rebuild_from); else none, and why."""
        cpusets = "rebuilt from the CPUs the containers run on"
        if self.started is None:
            return BalloonsAtRestart(None, f"{cpusets} (stateDir not set: not saved)")
        plans = PlanFile(self.started.path.parent)
        try:
            plan = plans.load()
        except SavedPlanError as exc:
            return BalloonsAtRestart(None, f"{cpusets}: the saved balloons in {plans.path} {exc}", logging.WARNING)
        if plan is None:
            return BalloonsAtRestart(None, f"{cpusets}: none saved in {plans.path} (the first start with this "
                                           "stateDir or this version, or the last write failed)")
        try:
            if config.reserved_cpuset is None and reserved != plan.reserved:
                kept = format_cpuset(reserved) if reserved is not None else "those deduced"
                raise SavedPlanError(f"names reserved CPUs {format_cpuset(plan.reserved)}, the restart keeps {kept}")
            return BalloonsAtRestart(rebuild_from(config, topology, found, plan), f"the saved balloons in {plans.path}")
        except SavedPlanError as exc:
            return BalloonsAtRestart(None, f"{cpusets}: the saved balloons in {plans.path} {exc}")

    def record(self, config: BalloonsConfig, reserved: frozenset[int], plan: SavedPlan | None = None) -> None:
        """Note ``reserved``, chosen under ``config``, and the balloons
        ``plan``, for the writer to save in ``config``'s stateDir; at once,
        no I/O. What was noted already is not written again, unless its
        write failed (a retry)."""
        if self._finished:
            return  # the hook stopped: the next instance may be reading the file
        directory = Path(config.state_dir) if config.state_dir else None
        if directory is None and self._held is None and (self._wanted is None or self._wanted.directory is None):
            return  # stateDir off, and no file of this hook's anywhere
        wanted = Wanted(directory, SavedReserved(reserved, fingerprint(config)), plan if directory else None)
        if wanted == self._wanted and self._failed is None:
            return  # written, or due
        self._wanted = wanted
        self._generation += 1
        self._due.set()

    @property
    def settled(self) -> bool:
        """The latest set noted is written (or its write failed): none due."""
        return not self._due.is_set() and self._written_generation == self._generation

    async def run(self) -> None:
        """The writer: the latest set noted, whenever one is due, until
        :meth:`finish` (the hook's stop); a cancel (the hook's background
        work ends) ends it without a write of its own."""
        while not self._finished:
            await self._due.wait()
            await self.write_due()

    async def finish(self, timeout: float | None = None) -> asyncio.Future[Any] | None:
        """The hook stops: write the set due, waiting up to ``timeout``; past
        it the set still waiting is dropped, and the write still in its
        thread, which nothing can stop, is returned, running: the hook's
        socket lock is kept until it ends (``HookServer._before_release``).
        Nothing else is written after this returns (the next instance may be
        reading the file). ``timeout``: ``STOP_WRITE_WAIT`` unless given."""
        timeout = STOP_WRITE_WAIT if timeout is None else timeout
        try:
            await asyncio.wait_for(self.write_due(), timeout)
        except TimeoutError:
            log.warning("stopping before the reserved CPUs were saved to %s (the write took over %.0fs): the set "
                        "still waiting is not written; a write still in flight keeps the socket's lock until it ends",
                        self._held.path if self._held else "stateDir", timeout)
        finally:
            self._finished = True
            self._due.set()  # a writer waiting for a set wakes and ends
        in_flight = self._in_flight
        if in_flight is None:
            return None
        in_flight.add_done_callback(_retrieved)  # its failure was the cancelled writer's to log
        return None if in_flight.done() else in_flight

    async def write_due(self) -> None:
        """Write the latest set noted until none is due (one writer at a
        time); nothing once :meth:`finish` has run."""
        async with self._writing:
            while self._due.is_set() and not self._finished:
                self._due.clear()
                wanted, generation = self._wanted, self._generation
                if wanted is not None:
                    try:
                        await self._write(wanted)
                    except asyncio.CancelledError:
                        # Its thread may finish it, or not: due again, unless
                        # finish() is dropping it.
                        self._due.set()
                        raise
                self._written_generation = generation

    async def _io(self, call: Callable[..., None], *args: Any) -> None:
        """``call`` in a thread; a write a cancelled writer left running is
        waited for first, so that two never run at once."""
        if self._in_flight is not None and not self._in_flight.done():
            await asyncio.shield(self._in_flight)
        self._in_flight = asyncio.get_running_loop().run_in_executor(None, functools.partial(call, *args))
        await asyncio.shield(self._in_flight)

    async def _write(self, wanted: Wanted) -> None:
        held = self._held
        if held is not None and held.path.parent != wanted.directory:
            await self._leave(held)
        if wanted.directory is None:
            self._held = None
            return
        file = self._held = ReservedFile(wanted.directory)
        plan = PlanFile(wanted.directory)
        cpus = format_cpuset(wanted.saved.cpus)
        try:
            await self._io(_save, file, plan, wanted.saved, wanted.plan)
        except OSError as exc:
            failure, self._failed = self._failed, (cpus, exc.errno, exc.strerror)
            again = failure == self._failed  # the error text may name a random temporary file: not compared
            if not again:
                log.warning("cannot save the reserved CPUs %s to %s: %s; retried at every reconcile pass",
                            cpus, file.path, exc, extra={"path": str(file.path), "error": str(exc)})
            if self._finished:  # the hook stopped meanwhile: the next instance's file now, not ours to remove
                return
            try:
                await self._io(_remove, file, plan)  # a restart deduces, rather than keep what is not true
            except OSError as gone:
                if not again:
                    log.error("cannot remove %s either: %s; a restart may keep reserved CPUs that are no longer "
                              "reserved where what runs does not contradict them", file.path, gone,
                              extra={"path": str(file.path), "error": str(gone)})
            return
        self._failed = None
        if self._logged != (file.path, wanted.saved):  # the balloons change at every hook call: not logged
            log.info("reserved CPUs %s saved to %s", cpus, file.path, extra={"path": str(file.path), "reserved_cpus": cpus})
        self._logged = (file.path, wanted.saved)

    async def _leave(self, held: ReservedFile) -> None:
        """stateDir moved or cleared: the file left there is removed, else a
        later start naming that directory again would trust it."""
        self._held = None
        try:
            await self._io(_remove, held, PlanFile(held.path.parent))
        except OSError as exc:
            log.error("cannot remove %s, left by a change of stateDir: %s; a start naming that directory again "
                      "may keep reserved CPUs that are no longer reserved: remove it", held.path, exc,
                      extra={"path": str(held.path), "error": str(exc)})
            return
        log.info("removed %s: stateDir changed", held.path, extra={"path": str(held.path)})
