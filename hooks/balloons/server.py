"""The balloons built-in hook: ``runtime-proxy hook run balloons``.

Every container is placed in one balloon at PreCreateContainer and held
there at PreUpdateContainerResources (kubelet's CPU manager or a resize
cannot move it out); PreStartContainer tells the hook the container's id,
PostStopContainer and PostStopPodSandbox release it. When a balloon's CPUs
change, the containers already in it are moved with UpdateContainerResources
on the runtime endpoint (see :mod:`.sync`). At start the assignments are
rebuilt from what the running containers are pinned to; until then hook
calls wait briefly and are refused (UNAVAILABLE) rather than answered
without knowing which CPUs are taken.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from cri_api.hookapi import api_pb2
from hooks.builtin import BuiltinHook, HookConfigInvalid
from hooks.sdk import HookAbort, HookServerError
from runtimeproxy.hookpath.points import HookType

from .balloon import Member, milli_from_shares
from .config import (
    BalloonsConfig,
    ConfigError,
    PodContext,
    parse_config,
)
from .hotplug import HotplugWatch
from .planning import UnknownBalloonType
from .pool import Exhausted, PoolError
from .runtime import RuntimeClient
from .moves import Cpuset
from .nodeid import MACHINE_ID, read_node
from .savedset import SavedSet
from .state import Assignments
from .status import StatusServer, balloons_snapshot, status_socket_for
from .reload import ConfigReload
from .sync import RECONCILE_INTERVAL
from .topology import Topology, TopologyError, format_cpuset

log = logging.getLogger("hooks.balloons")

READY_WAIT = 1.5  # how long a hook call waits for the start-up rebuild
POD_LIST_TIMEOUT = 0.5  # a refused container's pod, listed under the lock (see pre_create_container)


def _pod(request: api_pb2.ContainerResourceHookRequest) -> PodContext:
    return PodContext(
        request.pod_meta.namespace,
        request.pod_meta.name,
        request.container_meta.name,
        dict(request.pod_labels),
        dict(request.pod_annotations),
    )


def _answer(cpuset: Cpuset | None) -> api_pb2.ContainerResourceHookResponse | None:
    if cpuset is None or cpuset == ("", ""):
        return None
    cpus, mems = cpuset
    return api_pb2.ContainerResourceHookResponse(
        container_resources=api_pb2.LinuxContainerResources(cpuset_cpus=cpus, cpuset_mems=mems)
    )


class BalloonsHook(ConfigReload, BuiltinHook):
    NAME = "balloons"
    SUMMARY = "pins containers to pools of CPUs (balloons); NRI balloons policy config"
    HOOKS = (
        HookType.PRE_CREATE_CONTAINER,
        HookType.PRE_START_CONTAINER,
        HookType.PRE_UPDATE_CONTAINER_RESOURCES,
        HookType.POST_STOP_CONTAINER,
        HookType.POST_STOP_POD_SANDBOX,
    )
    # After the hooks at the default priority: a balloon is sized by the
    # cpu_shares it is shown, which must be those the runtime applies (and
    # later updates show), after e.g. batchresource's for BE pods.
    PRIORITY = 100

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        config: BalloonsConfig,
        *,
        config_path: str | os.PathLike[str] | None = None,
        topology: Topology | None = None,
        sysfs_root: str | os.PathLike[str] = "/sys",
        machine_id_path: str | os.PathLike[str] = MACHINE_ID,
        runtime: RuntimeClient | None = None,
        reconcile_interval: float = RECONCILE_INTERVAL,
        **server_options: Any,
    ) -> None:
        super().__init__(socket_path, **server_options)
        self._topology = topology or Topology.from_sysfs(sysfs_root)
        # Hotplug is followed on a machine read from sysfs, not on a given topology.
        self._hotplug = HotplugWatch(sysfs_root, self._topology) if topology is None else None
        self._topology_problem: str | None = None  # see RuntimeSync
        self._state = Assignments(config, self._topology)
        self._config_path = Path(config_path) if config_path else None
        self._runtime = runtime or RuntimeClient(config.runtime_endpoint)
        self._reconcile_interval = reconcile_interval
        self._lock = asyncio.Lock()
        self._events = 0  # see RuntimeSync
        self._retargets = 0
        self._ready = asyncio.Event()
        self._moves_due = asyncio.Event()
        self._not_ready_reason = "assignments not rebuilt from the runtime yet"
        self._status = StatusServer(status_socket_for(self.socket_path), self.status)
        self._stops = 0  # stops begun: one during the status server's start found none to stop (start)
        # The node named in the stateDir files, so a restart refuses another node's (nodeid.py).
        self._saved = SavedSet(config.state_dir, read_node(machine_id_path))
        for warning in config.warnings:
            log.warning("config: %s", warning)

    @classmethod
    def from_config(cls, socket_path: str, config: Mapping[str, Any], **options: Any) -> BalloonsHook:
        try:
            return cls(socket_path, parse_config(config), **options)
        except (ConfigError, PoolError, TopologyError) as exc:
            raise HookConfigInvalid(str(exc)) from None

    @property
    def state(self) -> Assignments:
        return self._state

    @property
    def config_file(self) -> Path | None:
        """The YAML file watched and reloaded (``hook run --config`` sets it)."""
        return self._config_path

    @config_file.setter
    def config_file(self, path: str | os.PathLike[str] | None) -> None:
        self._config_path = Path(path) if path else None

    @property
    def status_socket(self) -> Path:
        return self._status.path

    # -- lifecycle ---------------------------------------------------------------------

    def _used_up(self) -> str | None:
        return "its runtime client is closed" if self._runtime.closed else None

    async def _start_beside(self) -> None:
        """The status socket, part of the start (BuiltinHook._start): two
        starts under way share one, and its failure, or a stop cutting it,
        stops the hook (its last set written under the lock) before the start
        raises. A BalloonsHook that served is used once: its stop closes its
        runtime client and ends its saved-set writer for good, so a start
        after it is a HookServerError (build a new one). A start that failed
        leaves it as it was: what the stop, or the release step, closed opens
        again at the next start, under the socket's lock (:meth:`_before_serving`)."""
        stops = self._stops
        await self._status.start()
        if self._stops != stops:  # a stop ran while the status server started and found none to stop: this
            await self._status.stop()  # start must not leave one serving a stopped hook
            raise HookServerError(f"the start of the balloons hook on {self.socket_path} was cancelled by a stop "
                                  "(during its status socket's start)")

    async def _before_serving(self) -> None:
        """The socket's lock claimed: what a failed start's release step (or
        stop) closed, the runtime client and the saved-set writer, opens
        again here, not before: no move or write of this instance lands
        while another holds the lock. (A hook that served and was stopped
        never gets here: BuiltinHook._start refuses it.)"""
        await super()._before_serving()
        self._runtime.reopen()
        self._saved.reopen()

    async def _before_stop(self) -> None:
        self._stops += 1
        await self._status.stop()

    async def _after_stop(self) -> None:
        await self._runtime.close()

    async def _before_release(self) -> asyncio.Future[Any] | None:
        """The server stopped, its socket's lock still held: the last set of
        reserved CPUs is written now (bounded: SavedSet.finish), not after
        the next instance, waiting on the lock, has started and read it; a
        write stuck in its thread is returned, and handed over as it starts
        (a step cut first, its bound below STOP_WRITE_WAIT, keeps the lock too).
        The runtime client closes first, so no further move is sent before the
        lock goes (one applied later could undo the cpusets the next instance
        listed at its start). A move already sent is cancelled on our side
        only: containerd may still apply it, which the next instance's moves
        allow for (``maybe_moved``)."""
        await self._runtime.close()  # (again in _after_stop: a stop with no server to release skips this step)
        return await self._saved.finish(hand_over=self._keep_lock_until)

    async def background(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._rebuild_then_reconcile())
            tasks.create_task(self._move_containers())
            tasks.create_task(self._saved.run())
            if self._config_path is not None:
                tasks.create_task(self._watch_config(self._config_path))

    # -- hook handlers -------------------------------------------------------------------

    async def _wait_ready(self) -> None:
        try:
            await asyncio.wait_for(self._ready.wait(), READY_WAIT)
        except TimeoutError:
            raise HookAbort(grpc.StatusCode.UNAVAILABLE, f"balloons: {self._not_ready_reason}") from None

    def _place(
        self, request: api_pb2.ContainerResourceHookRequest, milli: int, answered: bool = True, retried: bool = False
    ) -> Cpuset | None:
        """Under the lock: assign the container and return what it runs on
        (``answered``: the proxy applies this hook point's answer, so the
        runtime will have it; else it is moved there like a running one;
        ``retried``: a PreCreate placed again after its pod's exited
        containers were released)."""
        pod = _pod(request)
        key = (request.pod_meta.uid, request.container_meta.name)
        member = Member(key, pod.namespace, pod.pod_name, milli, request.container_meta.id)
        try:
            balloon, fallback = self._state.place(member, pod)
        except UnknownBalloonType as exc:
            log.error("refusing container %s: %s", member.label, exc, extra={"container": member.label})
            raise HookAbort(grpc.StatusCode.INVALID_ARGUMENT, f"balloons: {exc}") from None
        except Exhausted as exc:
            log.error("refusing container %s: %s", member.label, exc, extra={"container": member.label})
            raise HookAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"balloons: {exc}") from None
        # What a refused attempt released (a previous attempt of the container,
        # the pod's exited ones, see pre_create_container) and this retry left
        # goes to the balloons short of CPUs now, before the answer: with
        # shareIdleCPUsInSame it would name idle CPUs they take. (A first
        # attempt's previous one: state.place grows them itself.)
        if retried:
            self._state.grow_short()
        cpuset = self._state.target(key)
        assert cpuset is not None
        if answered:
            self._state.given(key, cpuset)
        log.info(
            "assigning container %s to balloon %s%s",
            member.label,
            self._state.pool.describe(balloon),
            " (its balloon type cannot take it in full; onExhausted: Ignore)" if fallback else "",
            extra={"container": member.label, "balloon": balloon.name, "cpus": cpuset[0], "mems": cpuset[1],
                   "milli_cpus": milli, "fallback": fallback},
        )
        return cpuset

    async def pre_create_container(self, request: api_pb2.ContainerResourceHookRequest) -> api_pb2.ContainerResourceHookResponse | None:
        await self._wait_ready()
        milli = milli_from_shares(request.container_resources.cpu_shares)
        async with self._lock:
            self._events += 1
            self._follow_hotplug()  # not to give a CPU gone offline
            try:
                try:
                    cpuset = self._place(request, milli)
                except HookAbort as refusal:
                    # The pod's init containers that finished still count (no stop
                    # event comes for them) until reconcile sees them exited: kubelet
                    # creates the next container at once. Ask the runtime now.
                    if refusal.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    if not await self._release_exited(request.pod_meta.uid):
                        raise
                    cpuset = self._place(request, milli, retried=True)
            except BaseException:
                # What a refused attempt released (a previous attempt of the
                # container, the pod's exited ones) went to no balloon short
                # of CPUs: the retry came first. Refused, it goes now.
                self._state.grow_short()
                raise
            finally:
                self._save()  # what it released or placed, for a restart
        self._moves_due.set()  # the balloon may have grown: its other containers move
        return _answer(cpuset)

    async def _release_exited(self, pod_uid: str) -> bool:
        """Under the lock: release the pod's members the runtime lists as exited; True if any was."""
        if not any(m.container_id for m in self._state.members_of_pod(pod_uid)):
            return False
        try:
            # Just this pod's, quickly: every hook event of the node waits on the lock.
            live, exited = await self._runtime.pod_containers(pod_uid, POD_LIST_TIMEOUT)
        except grpc.aio.AioRpcError as err:
            log.warning("cannot list a pod's containers to free its exited ones: %s", err.code().name,
                        extra={"pod_uid": pod_uid})
            return False
        return self._state.release_exited(live, exited, pod_uid, grow=False)  # the retry comes first

    async def pre_start_container(self, request: api_pb2.ContainerResourceHookRequest) -> api_pb2.ContainerResourceHookResponse | None:
        await self._wait_ready()
        key = (request.pod_meta.uid, request.container_meta.name)
        async with self._lock:
            self._events += 1
            balloon = self._state.pool.balloon_of(key)
            if balloon is None:
                # Created while this hook was not there (or its PreCreateContainer
                # failed under Ignore): a PreStartContainer answer is never applied,
                # so it is moved to its balloon once it starts, as a running one.
                self._place(request, milli_from_shares(request.container_resources.cpu_shares), answered=False)
            else:
                balloon.members[key].container_id = request.container_meta.id
            self._save()
        # Its balloon may have changed between create and start: then it moves after the start.
        self._moves_due.set()
        return None

    async def pre_update_container_resources(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        await self._wait_ready()
        key = (request.pod_meta.uid, request.container_meta.name)
        shares = request.container_resources.cpu_shares
        async with self._lock:
            self._events += 1
            balloon = self._state.pool.balloon_of(key)
            if balloon is None:
                cpuset = self._place(request, milli_from_shares(shares))
            else:
                member = balloon.members[key]
                member.container_id = request.container_meta.id or member.container_id
                # No shares in the request (as in this hook's own moves): the request stands.
                if shares and not self._state.resize(key, milli_from_shares(shares)):
                    message = (
                        f"container {member.label} asks for {milli_from_shares(shares)}m CPU; its balloon "
                        f"{balloon.name} cannot grow to that (maxCPUs {balloon.btype.max_cpus or 'unlimited'}, "
                        f"{len(self._state.pool.free)} CPU(s) free)"
                    )
                    if self._state.config.on_exhausted == "Fail":
                        log.error("refusing update: %s", message, extra={"container": member.label})
                        raise HookAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"balloons: {message}")
                    taken = member.milli == milli_from_shares(shares)
                    outcome = "its balloon takes the CPUs free, and more as they are freed" if taken else \
                        "it stays in its balloon as it is"
                    log.warning("%s; %s", message, outcome, extra={"container": member.label})
                cpuset = self._state.target(key)
                assert cpuset is not None
                self._state.given(key, cpuset)
            self._save()
        self._moves_due.set()
        return _answer(cpuset)

    async def post_stop_container(self, request: api_pb2.ContainerResourceHookRequest) -> None:
        async with self._lock:
            self._events += 1
            self._state.release((request.pod_meta.uid, request.container_meta.name), request.container_meta.id)
            self._save()
        self._moves_due.set()

    async def post_stop_pod_sandbox(self, request: api_pb2.PodSandboxHookRequest) -> None:
        async with self._lock:
            self._events += 1
            self._state.release_pod(request.pod_meta.uid)
            self._save()
        self._moves_due.set()

    # -- status -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        pool = self._state.pool
        return {
            "ready": self._ready.is_set(),
            "online_cpus": format_cpuset(self._topology.all_cpus),
            # Set while the balloons are planned on CPUs that are no longer all online.
            "topology_problem": self._topology_problem,
            "reserved_cpus": format_cpuset(pool.reserved),
            "available_cpus": format_cpuset(pool.available),
            "free_cpus": format_cpuset(pool.free),
            "balloons": balloons_snapshot(pool),
        }
