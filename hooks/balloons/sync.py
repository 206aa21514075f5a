"""The balloons hook's work with the runtime, beside the hook calls: the
start-up rebuild of the assignments from what the running containers are
pinned to, the periodic reconcile with the runtime's listing, the re-plan
after CPU or memory hotplug (:mod:`.hotplug`), and the moves of running
containers whose balloon changed (UpdateContainerResources on the runtime
endpoint, see :mod:`.runtime`).

A mixin of :class:`~.server.BalloonsHook`: it shares the hook's state, lock
and event count with the hook handlers.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from ..criclient import ClientClosed, EndpointChanged
from . import planning, restoring, savedplan
from .balloon import Member, milli_from_shares
from .hotplug import HotplugWatch
from .planning import Restored
from .pool import PoolError
from .runtime import RuntimeClient
from .savedset import SavedSet
from .state import Assignments
from .topology import Topology, format_cpuset

log = logging.getLogger("hooks.balloons")

RETRY_DELAY = 5.0  # after a failed move or rebuild
RECONCILE_INTERVAL = 30.0
# A container placed at PreCreateContainer is not in the runtime's list until
# CreateContainer returns: do not take it for gone before kubelet's deadline.
# (One the runtime lists as exited, with the id the hook knows, goes at once.)
CREATE_GRACE = 150.0
# A move that ended so may have been applied by the runtime all the same (a
# slow runtime past the deadline, a connection lost after the request went).
UNSURE_OUTCOME = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE})


def _call_cancelled() -> bool:
    """In an ``except asyncio.CancelledError``: True if it is not this task's
    cancellation but a runtime call's. grpc raises it for a call cancelled on
    this side, as when a reload that changes runtimeEndpoint closes the channel
    under it; let through, it would end the loop for good (a TaskGroup takes a
    child that ends cancelled for one that was cancelled, and says nothing)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


class RuntimeSync:
    """Rebuild, reconcile and moves; the hook's ``__init__`` sets these."""

    _state: Assignments
    # The machine as last read; the plan (``_state.topology``) is another one
    # only while the config does not fit it (``_topology_problem`` says why).
    _topology: Topology
    _hotplug: HotplugWatch | None  # None: a topology given, not read from sysfs
    _topology_problem: str | None
    _runtime: RuntimeClient
    _reconcile_interval: float
    _lock: asyncio.Lock
    # Hook events that changed membership: reconcile acts on a listing only
    # if none came while it was taken (a stop, or a restart, since then).
    _events: int
    # Reloads that changed runtimeEndpoint: a listing taken before one
    # describes the old endpoint's runtime, not the configured one.
    _retargets: int
    _ready: asyncio.Event
    _moves_due: asyncio.Event
    _not_ready_reason: str
    _saved: SavedSet  # the reserved CPUs and balloons saved for a restart (stateDir)

    async def _rebuild_then_reconcile(self) -> None:
        while not self._ready.is_set():
            try:
                await self.rebuild()
            except grpc.aio.AioRpcError as exc:
                self._not_ready_reason = (
                    f"cannot rebuild assignments: runtime {self._runtime.endpoint} answered "
                    f"{exc.code().name}: {exc.details()}"
                )
            except asyncio.CancelledError:
                if not _call_cancelled():
                    raise
                if self._runtime.closed:
                    return  # the hook is stopping: its close() cancelled the listing
                self._not_ready_reason = "cannot rebuild assignments: the call to the runtime was cancelled (its channel closed)"
            except EndpointChanged as exc:
                log.info("rebuilding the assignments again: %s while the runtime was listed", exc)
                continue  # at once, from the new endpoint
            except ClientClosed:
                return  # the hook is stopping
            else:
                continue
            log.warning("%s; retrying in %.0fs", self._not_ready_reason, RETRY_DELAY)
            await asyncio.sleep(RETRY_DELAY)
        while True:
            await asyncio.sleep(self._reconcile_interval)
            try:
                await self.reconcile()
            except grpc.aio.AioRpcError as exc:
                log.warning("reconcile with the runtime failed: %s: %s", exc.code().name, exc.details())
            except asyncio.CancelledError:
                if not _call_cancelled():
                    raise
                if self._runtime.closed:
                    return
                log.warning("reconcile with the runtime failed: the call was cancelled (its channel closed)")
            except EndpointChanged as exc:
                log.info("reconcile waits for the next pass: %s while the runtime was listed", exc)
            except ClientClosed:
                return

    async def rebuild(self) -> None:
        """Assignments from the containers that run now (start-up)."""
        retargets = self._retargets
        found = (await self._runtime.list_containers()).live
        restored = [
            Restored(Member(f.key, f.pod.namespace, f.pod.pod_name, milli_from_shares(f.shares), f.container_id), f.pod, f.cpus,
                     f.mems, created=f.created_at)
            # By creation, not listing, order: a rebuild from the cpusets places
            # those not pinned yet in this order, as reconcile adopts
            # (planning.creation_order); the saved balloons sort their new ones so too.
            for f in sorted(found, key=lambda f: planning.creation_order(f.created_at, f.container_id))
        ]
        async with self._lock:
            if self._retargets != retargets:
                raise EndpointChanged(f"runtimeEndpoint changed to {self._state.config.runtime_endpoint}")
            config, topology = self._state.config, self._state.topology
            kept, balloons = self._saved.at_start.restart(config, topology, restored)
            self._state = balloons.state or restoring.rebuild(config, topology, restored, kept.reserved)
            if config.reserved_cpuset is None:
                reserved = format_cpuset(self._state.pool.reserved)
                log.log(kept.level, "reserved CPUs %s at start: %s", reserved, kept.why,
                        extra={"reserved_cpus": reserved, "saved": kept.reserved is not None, "reason": kept.why})
            log.log(balloons.level, "balloons at start: %s", balloons.why,
                    extra={"saved": balloons.state is not None, "reason": balloons.why, **(balloons.changes or {})})
            self._ready.set()
            self._save()
        running = sum(f.running for f in found)
        log.info("assignments rebuilt from %d live containers (%d running, %d created, not started yet)",
                 len(found), running, len(found) - running,
                 extra={"containers": len(found), "running": running, "not_started": len(found) - running})
        self._moves_due.set()

    async def reconcile(self) -> None:
        """Release containers the runtime no longer runs (a stop the hook did not see, an
        exit), learn ids, and place live containers the hook does not know.

        An exited container (an init container that finished, a crash waiting
        for its restart: kubelet keeps it, no stop event comes) is released at
        once if it is the member's known container and nothing of its key is
        live. A member whose id is unknown or another one is being re-created
        (a new PreCreateContainer placed it): only the grace releases it."""
        async with self._lock:
            self._save(retry=True)  # again, if the last write failed (hook calls do not retry)
            self._follow_hotplug(retry=True)
        events, retargets = self._events, self._retargets
        listing = await self._runtime.list_containers()
        now = time.monotonic()
        async with self._lock:
            if self._retargets != retargets:
                raise EndpointChanged(f"runtimeEndpoint changed to {self._state.config.runtime_endpoint}")
            if self._events != events:
                # A container stopped, or restarted, since the listing: it would
                # be adopted again, or given its predecessor's id. Next pass.
                log.debug("hook events while the runtime was listed; reconcile waits for the next pass")
                return
            self._state.reconcile(listing, now, CREATE_GRACE)
            self._save()
        self._moves_due.set()

    def _follow_hotplug(self, retry: bool = False) -> None:
        """Under the lock: after CPU or memory hotplug, re-plan the balloons on
        the machine as it is now, as a config reload does: each keeps its
        containers and its CPUs still online and grows back from the free ones;
        the containers whose cpuset changed are moved. A config the machine no
        longer fits (reserved or available CPUs offline, minBalloons) keeps
        the plan as it was, logged and in the status, until it fits again.
        ``retry``: a topology that could not be read is read again even if the
        online CPUs and memory nodes are the same (reconcile passes only)."""
        topology = self._hotplug.changed(retry) if self._hotplug is not None else None
        if topology is None:
            return
        self._topology = topology
        try:
            state = restoring.replan(self._state, self._state.config, topology)
        except PoolError as exc:
            self._topology_problem = f"the config does not fit the CPUs online now: {exc}"
            log.error("balloons stay as they were planned: %s; bring the CPUs back or change the config",
                      self._topology_problem, extra={"reason": str(exc)})
            return
        self._state, self._topology_problem = state, None
        log.info("balloons re-planned on the CPUs online now", extra={"online_cpus": format_cpuset(topology.all_cpus)})
        self._save()
        self._moves_due.set()

    def _save(self, retry: bool = False) -> None:
        """Under the lock: the reserved CPUs and the balloons saved for a
        restart (stateDir), noted for the writer if they or the config
        changed since the last write (no I/O here: this runs on hook calls
        too); after a failed write, written again only on a ``retry`` (a
        reconcile pass, a reload). Only once the start-up rebuild is done:
        before, the reserved CPUs are a fresh pick, and the files still hold
        those the restart is to keep. At start-up, a reload, a re-plan after
        hotplug, every hook call that may change a balloon and every
        reconcile pass."""
        if self._ready.is_set():
            state = self._state
            config_print = self._saved.fingerprint(state.config)
            plan = savedplan.snapshot(state, config_print) if state.config.state_dir else None
            self._saved.record(state.config, state.pool.reserved, plan, retry=retry)

    async def _move_containers(self) -> None:
        while True:
            await self._moves_due.wait()
            self._moves_due.clear()
            try:
                ok = await self.apply_moves()
            except ClientClosed:
                return  # the hook is stopping: the moves left are not sent
            if not ok:
                asyncio.get_running_loop().call_later(RETRY_DELAY, self._moves_due.set)

    async def apply_moves(self) -> bool:
        """Move every container whose balloon changed; False if some move failed
        (retried later); ClientClosed once the hook is stopping."""
        async with self._lock:
            moves = self._state.moves()
            if moves:
                # The online CPUs first, as for a placement: a CPU gone offline
                # since the last read would be named in the moves (runc cannot
                # write it under cgroup v1) and their retries until the next
                # reconcile pass. A re-plan gives other moves.
                self._follow_hotplug()
                moves = self._state.moves()
        ok = True
        for move in moves:
            cpus, mems = move.cpuset
            try:
                await self._runtime.update_cpuset(move.container_id, cpus, mems)
            except asyncio.CancelledError:
                if not _call_cancelled():
                    raise
                if self._runtime.closed:
                    raise ClientClosed("the hook is stopping") from None
                log.warning(
                    "cannot move container %s to cpus %s: the call was cancelled (the runtime channel closed)",
                    move.label, cpus,
                    extra={"container": move.label, "container_id": move.container_id, "balloon": move.balloon},
                )
                async with self._lock:
                    self._state.maybe_moved(move)  # it may have reached the runtime
                # The rest wait for the retry: a call now would open a channel
                # again, maybe to a closing hook's runtime.
                return False
            except EndpointChanged as exc:
                # Not sent: still due. The reload that retargeted asked for moves
                # again, which go to the new endpoint.
                log.info("moves wait for the next pass: %s while container %s was being moved", exc, move.label,
                         extra={"container": move.label, "container_id": move.container_id})
                return False
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    async with self._lock:
                        self._state.release(move.key, move.container_id)
                        self._save()
                    continue
                log.warning(
                    "cannot move container %s to cpus %s: %s: %s",
                    move.label, cpus, exc.code().name, exc.details(),
                    extra={"container": move.label, "container_id": move.container_id, "balloon": move.balloon},
                )
                async with self._lock:
                    if exc.code() in UNSURE_OUTCOME:
                        self._state.maybe_moved(move)
                    else:
                        self._state.not_moved(move)
                ok = False
                continue
            async with self._lock:
                self._state.moved(move)
            log.info(
                'moving container %s to the new cpus of its balloon %s{cpus:"%s", mems:"%s"}',
                move.label, move.balloon, cpus, mems,
                extra={"container": move.label, "container_id": move.container_id, "balloon": move.balloon, "cpus": cpus, "mems": mems},
            )
        return ok
