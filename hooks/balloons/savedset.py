"""The hook's saved reserved set and balloons (``stateDir``): read at start, written by one writer.

A restart reads the file in the stateDir the hook started with
(savedstart.py: :meth:`~.savedstart.StartFiles.restart`), whatever a reload before the start-up
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
ended (``hooks.releasestep``). Each write in a thread is also handed to the
SDK as it starts (``hand_over``: ``HookServer._keep_lock_until``), so a
step cut before finish() returns (a ``release_step_timeout`` below
``STOP_WRITE_WAIT``, a cancelled stop) keeps the lock for it all the same:
no write of this hook lands after the
next instance, waiting on the lock, has read the file or written its own;
the stop itself ends. What an operator sees then: the warning below, then
the SDK's "keeps its socket's lock until disk I/O it cannot cut has ended";
the process does not exit before the write ends (asyncio.run joins the
default executor's threads as it closes; the lock waits on the executor's
own future, which its cancel of the tasks left does not touch), and
a next instance waits on the lock and is refused past its wait, naming this
pid. The write is atomic (``hooks.statefile.write_atomic``: a temporary
file renamed into place), so however late it lands it never tears the file.
From then on nothing is written, unless the stop was a start's that
failed: the next start reopens the writer (:meth:`SavedSet.reopen`), under
the lock again.

The balloons (savedplan.py) are noted with the set, on every change of the
plan (each hook call under the lock), and written by the same writer in the
same thread call, after the set: ``balloons.json`` names the reserved CPUs
too, so a restart after a crash between the two writes sees they differ. A
failed write removes both files; leaving a directory removes both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .config import BalloonsConfig
from . import savedio
from .nodeid import NO_NODE, Node
from .savedio import FileFailed
from .savedplan import PlanFile, SavedPlan
from .savedreserved import ReservedFile, SavedReserved, fingerprint
from .savedstart import StartFiles
from .topology import format_cpuset

log = logging.getLogger("hooks.balloons")

# How long a stopping hook waits for the set due to be written before it
# drops it (a write already in its thread keeps the socket's lock: finish()).
STOP_WRITE_WAIT = 2.0

class Wanted(NamedTuple):
    """A set (and the balloons) to write, and where (None: stateDir off, the files left)."""

    directory: Path | None
    saved: SavedReserved
    plan: SavedPlan | None = None


class _Finished(Exception):
    """A write was to start once finish() had returned or been cut: none does."""


def _retrieved(write: asyncio.Future[Any]) -> None:
    if not write.cancelled():
        write.exception()


class SavedSet:
    def __init__(self, state_dir: str, node: Node = NO_NODE) -> None:
        # This node's machine id ("": none), named in the files written and
        # checked in those a restart reads (nodeid.py).
        self._node = node.id
        # Why there is none, said once a stateDir is in use (now, or at the
        # first write to one a reload sets): a node running without one has
        # no use for the line. "": said, or nothing to say.
        self._missing, self._missing_path = node.missing, node.path
        if state_dir:
            self._say_missing()
        # The files a restart reads: those of the stateDir the hook started with.
        started = ReservedFile(Path(state_dir), node.id) if state_dir else None
        self.at_start = StartFiles(started)
        # The file this hook holds (writes, or the run before it wrote):
        # removed when a reload leaves its directory.
        self._held = started
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
        self._hand_over: Callable[[asyncio.Future[Any]], None] | None = None  # finish()'s: each write as it starts
        self._finishing: asyncio.Task[Any] | None = None  # finish()'s task: once it is cut, no write starts
        self._logged: tuple[Path, SavedReserved] | None = None  # the set last logged as saved, and where
        # The reserved.json this hook last wrote and knows is there (its
        # directory, set and token): a write of the same set leaves it be
        # and writes balloons.json alone, with that token. None: unknown.
        self._on_disk: tuple[Path, SavedReserved] | None = None
        self._prints: tuple[BalloonsConfig, str] | None = None  # the last config fingerprinted (kept alive: compared by identity)

    def _say_missing(self) -> None:
        """No machine id, a stateDir in use: said once, at info."""
        if self._missing:
            log.info("%s: the stateDir files are written naming no node, and a restart does not check which node "
                     "wrote them", self._missing, extra={"path": self._missing_path})
            self._missing = ""

    def fingerprint(self, config: BalloonsConfig) -> str:
        """fingerprint(config), that of the last config asked cached: hook
        calls ask at every call, with the same (frozen) config."""
        if self._prints is None or self._prints[0] is not config:
            self._prints = (config, fingerprint(config))
        return self._prints[1]

    def record(self, config: BalloonsConfig, reserved: frozenset[int], plan: SavedPlan | None = None, *,
               retry: bool = False) -> None:
        """Note ``reserved``, chosen under ``config``, and the balloons
        ``plan``, for the writer to save in ``config``'s stateDir; at once,
        no I/O. What was noted already is not written again. While a write
        has failed, only a ``retry`` (a reconcile pass, a reload) writes
        again, the latest noted: hook calls, which note at every call, would
        hit a full or read-only disk at their rate."""
        if self._finished:
            return  # the hook stopped: the next instance may be reading the file
        directory = Path(config.state_dir) if config.state_dir else None
        if directory is None and self._held is None and (self._wanted is None or self._wanted.directory is None):
            return  # stateDir off, and no file of this hook's anywhere
        wanted = Wanted(directory, SavedReserved(reserved, self.fingerprint(config)), plan if directory else None)
        if self._failed is not None and not retry:
            if wanted != self._wanted:
                self._wanted = wanted  # for the retry (write_due: or once a write under way succeeds)
            return
        if wanted == self._wanted and self._failed is None:
            return  # written, or due
        self._wanted = wanted
        self._generation += 1
        self._due.set()

    @property
    def settled(self) -> bool:
        """The latest set noted is written (or a write failed, and it waits
        for the retry): none due."""
        return not self._due.is_set() and self._written_generation == self._generation

    async def run(self) -> None:
        """The writer: the latest set noted, whenever one is due, until
        :meth:`finish` (the hook's stop); a cancel (the hook's background
        work ends) ends it without a write of its own."""
        while not self._finished:
            await self._due.wait()
            await self.write_due()

    async def finish(self, timeout: float | None = None,
                     hand_over: Callable[[asyncio.Future[Any]], None] | None = None) -> asyncio.Future[Any] | None:
        """The hook stops: write the set due, waiting up to ``timeout``; past
        it the set still waiting is dropped, and the write still in its
        thread, which nothing can stop, is returned, running: the hook's
        socket lock is kept until it ends (``HookServer._before_release``).
        Nothing else is written after this returns, or once it is cut (the
        next instance may be reading the file): a write waiting for the one
        in its thread does not start. ``timeout``: ``STOP_WRITE_WAIT`` unless given.
        ``hand_over`` is given the write in its thread now, and each one
        started until this ends, as it starts: one that is cut before it
        could return it (its caller's bound, a cancel) still has it."""
        timeout = STOP_WRITE_WAIT if timeout is None else timeout
        self._hand_over, self._finishing = hand_over, asyncio.current_task()
        if hand_over is not None and self._in_flight is not None and not self._in_flight.done():
            hand_over(self._in_flight)  # the writer's, under way: the lock must wait for it whatever comes next
        if self._failed is not None:
            self._due.set()  # a last try of what hook calls noted since the failure
        try:
            await asyncio.wait_for(self.write_due(), timeout)
        except TimeoutError:
            log.warning("stopping before the reserved CPUs and the balloons were saved in %s (the write took over "
                        "%.0fs): what is still waiting is not written; a write still in flight keeps the socket's "
                        "lock until it ends", self._held.path.parent if self._held else "stateDir", timeout)
        finally:
            self._finished = True
            self._hand_over = self._finishing = None
            self._due.set()  # a writer waiting for a set wakes and ends
        in_flight = self._in_flight
        if in_flight is None:
            return None
        in_flight.add_done_callback(_retrieved)  # its failure was the cancelled writer's to log
        return None if in_flight.done() else in_flight

    def reopen(self) -> None:
        """Writing again after :meth:`finish`: a start that failed ran it in
        its release step, and the next start, under the socket's lock again,
        reopens the writer (one that served and stopped is never started
        again). It runs at every start, the first too: a set noted and not
        written (a rebuild run before the start, as tests do) stays due. A write
        still in its thread kept the lock: the start was refused till it ended."""
        self._finished = False
        if self._written_generation == self._generation:
            self._due.clear()  # (finish() set it to wake the writer it ended)

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
                    except _Finished:
                        return
                    except asyncio.CancelledError:
                        # Its thread may finish it, or not: due again, unless
                        # finish() is dropping it.
                        self._due.set()
                        raise
                    if self._failed is None and self._wanted is not wanted:
                        self._due.set()  # noted by a hook call while a retry ran, which succeeded
                self._written_generation = generation

    async def _io(self, call: Callable[..., None], *args: Any) -> None:
        """``call`` in a thread; a write a cancelled writer left running is
        waited for first, so that two never run at once."""
        if self._in_flight is not None and not self._in_flight.done():
            await asyncio.shield(self._in_flight)
        # finish() may have ended meanwhile, or been cut (its step's bound,
        # a cancelled stop) before it could: a write started now would be
        # handed over too late, or to no one, and land after the lock went.
        finishing = self._finishing
        if self._finished or (finishing is not None and finishing.cancelling()):
            self._finished = True  # (finish() cut: its finally sets it a loop step or two later)
            raise _Finished
        self._in_flight = asyncio.get_running_loop().run_in_executor(None, functools.partial(call, *args))
        if self._hand_over is not None:  # finish() under way: the lock waits for this one, however finish() ends
            self._hand_over(self._in_flight)
        await asyncio.shield(self._in_flight)

    async def _write(self, wanted: Wanted) -> None:
        held = self._held
        if held is not None and held.path.parent != wanted.directory:
            await self._leave(held)
            if self._finished:  # the stop gave up on the removal meanwhile: its lock waited for that one alone
                return
        if wanted.directory is None:
            self._held = None
            return
        self._say_missing()  # (stateDir turned on by a reload: the first write there)
        file = self._held = ReservedFile(wanted.directory, self._node)
        plan = PlanFile(wanted.directory, self._node)
        cpus = format_cpuset(wanted.saved.cpus)
        # reserved.json is written only when its set changed (or is not known
        # to be there), with a new token; balloons.json always, with the token
        # of the reserved.json beside it: a crash between the two leaves them
        # with different tokens, which a restart sees.
        kept = self._on_disk
        fresh = kept is None or kept != (wanted.directory, wanted.saved)
        saved = dataclasses.replace(wanted.saved, token=secrets.token_hex(8)) if fresh or kept is None else kept[1]
        self._on_disk = None  # unknown until the write is done (a cancel leaves it so)
        try:
            await self._io(savedio.save, file, plan, saved, wanted.plan, fresh)
        except FileFailed as exc:
            await self._failed_write(wanted, file, plan, cpus, exc)
            return
        self._on_disk = (wanted.directory, saved)
        self._failed = None
        if self._logged != (file.path, wanted.saved):  # the balloons change at every hook call: not logged
            log.info("reserved CPUs %s saved to %s", cpus, file.path, extra={"path": str(file.path), "reserved_cpus": cpus})
        self._logged = (file.path, wanted.saved)

    async def _failed_write(self, wanted: Wanted, file: ReservedFile, plan: PlanFile, cpus: str, exc: FileFailed) -> None:
        """Log the failure once per set and error, and remove both files."""
        error = exc.error
        failure, self._failed = self._failed, (cpus, error.errno, error.strerror)
        self._logged = None  # a later write that succeeds is logged: the recovery
        again = failure == self._failed  # the error text may name a random temporary file: not compared
        directory = file.path.parent
        if not again:
            log.warning("cannot save the reserved CPUs %s and the balloons in %s: writing %s failed: %s; both files "
                        "removed, retried at every reconcile pass", cpus, directory, exc.path.name, error,
                        extra={"path": str(exc.path), "error": str(error)})
        if self._finished:  # the hook stopped meanwhile: the next instance's file now, not ours to remove
            return
        try:
            await self._io(savedio.remove, file, plan)  # a restart deduces, rather than keep what is not true
        except FileFailed as gone:
            if not again:
                log.error("cannot remove %s either: %s; a restart may keep reserved CPUs or balloons that are no "
                          "longer true where what runs does not contradict them", gone.path, gone.error,
                          extra={"path": str(gone.path), "error": str(gone.error)})

    async def _leave(self, held: ReservedFile) -> None:
        """stateDir moved or cleared: the files left there are removed, else a
        later start naming that directory again would trust them."""
        self._held = None
        self._on_disk = None  # gone (or unknown, if the removal fails): named again, both are written
        directory = held.path.parent
        try:
            await self._io(savedio.remove, held, PlanFile(directory))
        except FileFailed as exc:
            log.error("cannot remove %s, left by a change of stateDir: %s; a start naming that directory again "
                      "may keep reserved CPUs or balloons no longer in use: remove it", exc.path, exc.error,
                      extra={"path": str(exc.path), "error": str(exc.error)})
            return
        log.info("removed the saved reserved CPUs and balloons in %s: stateDir changed", directory,
                 extra={"path": str(directory)})
