"""NRI events through the proxy's own hook stage.

Each event becomes the CRI request the runtime is carrying out and runs
through :class:`~runtimeproxy.hookpath.stage.HookStage` exactly as a proxied
call would: same registry, dispatcher, chain order, policies, merge rules,
skip label, per-object locks, store and metrics. The stage's "backend call"
is the NRI answer: the request as the hooks left it is turned into the
adjustment or update, and the stage then records the call and starts its post
hooks. For StartContainer the backend call lasts until the runtime reports
PostStartContainer, so PostStartContainer hooks see a running container.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn, TypeVar, cast

from google.protobuf.message import Message
from grpc import aio

from cri_api.nri import api_pb2 as nri
from cri_api.v1 import api_pb2 as v1

from ..hookpath.executor import HOOKED_METHODS
from ..hookpath.hookfile import FailurePolicy
from ..hookpath.merge import hook_resources, merge_resources
from ..hookpath.points import HOOK_POINTS
from ..hookpath.runtimespec import cgroup_parent_from_path
from ..hookpath.stage import HookStage
from ..hookpath.store import StateStore, container_record, pod_record
from . import convert
from .limits import HOOK_DEADLINE
from .ttrpc import FAILED_PRECONDITION, REQUEST_DEADLINE, TtrpcError

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Message)
E = nri.Event
SUBSCRIBED = (
    E.RUN_POD_SANDBOX,
    E.STOP_POD_SANDBOX,
    E.REMOVE_POD_SANDBOX,
    E.CREATE_CONTAINER,
    E.START_CONTAINER,
    E.POST_START_CONTAINER,
    E.UPDATE_CONTAINER,
    E.STOP_CONTAINER,
    E.REMOVE_CONTAINER,
)
# How long a started container's hook call waits for PostStartContainer
# before giving up its post hooks (the start failed and nothing else came).
START_WAIT = 60.0
BACKSTOP = 0.1  # past the hooks' deadline, still within the runtime's timeout
# Part of the runtime's timeout kept for the answer's way back and our own
# work (on a loaded node); the hooks of one event get the rest, together.
ANSWER_MARGIN = 0.5


class HookRefused(Exception):
    """A Fail hook refused the call (the stage's abort)."""


class _StartFailed(Exception):
    """The container never reported running: no PostStartContainer hooks."""


class _RefusingContext:
    """The stage's view of the caller: an abort refuses the NRI request."""

    async def abort(self, code: object, details: str) -> NoReturn:
        raise HookRefused(details)


class HookAdapter:
    """The :class:`~.plugin.EventHandler` that runs events through the hook stage."""

    def __init__(self, stage: HookStage, store: StateStore, budget: float) -> None:
        self.stage = stage
        self.store = store
        self.budget = budget  # seconds the hooks of one event may take
        self._context = cast(aio.ServicerContext, _RefusingContext())
        self._starting: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[bytes]] = set()

    def events(self) -> Sequence[int]:
        return SUBSCRIBED

    # ---- state ----------------------------------------------------------

    async def synchronize(self, pods: Sequence[nri.PodSandbox], containers: Sequence[nri.Container]) -> None:
        """Make the store what the runtime has: what exists now replaces
        what the store remembered from before a disconnect."""
        pod_ids = {pod.id for pod in pods}
        for gone in set(self.store.pods) - pod_ids:
            self.store.drop_pod(gone)
        for pod in pods:
            self._put_pod(pod)
        by_id = {pod.id: pod for pod in pods}
        container_ids = {c.id for c in containers}
        for gone in set(self.store.containers) - container_ids:
            self.store.drop_container(gone)
        for container in containers:
            owner = by_id.get(container.pod_sandbox_id)
            if owner is not None:
                self._put_container(owner, container)

    def _put_pod(self, pod: nri.PodSandbox) -> None:
        self.store.put_pod(pod.id, pod_record(convert.pod_config(pod), pod.runtime_handler))

    def _put_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        record = container_record(self.store.pods[pod.id], convert.container_config(container), container.id)
        # Where the container is: a PreCreateContainer hook may have moved it
        # from the pod's parent (as the CRI path reads it from the runtime spec).
        record.pod_cgroup_parent = cgroup_parent_from_path(
            container.linux.cgroups_path, container.id, record.pod_cgroup_parent
        )
        self.store.put_container(container.id, pod.id, record)

    def _ensure(self, pod: nri.PodSandbox, container: nri.Container | None = None) -> None:
        """Records for objects the store has not seen (created while the
        plugin was away and not in its Synchronize), from the event's data."""
        if pod.id and pod.id not in self.store.pods:
            self._put_pod(pod)
        if container is not None and container.id and container.id not in self.store.containers:
            self._put_container(pod, container)

    def disconnected(self) -> None:
        for container_id in list(self._starting):
            self._finish_start(container_id, started=False)

    # ---- events ---------------------------------------------------------

    async def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.ContainerAdjustment:
        self._ensure(pod)
        before = convert.create_request(pod, container)
        reply = v1.CreateContainerResponse(container_id=container.id)
        after = await self._through_stage("CreateContainer", before, reply)
        return convert.container_adjustment(container, before, after)

    async def update_container(
        self, pod: nri.PodSandbox, container: nri.Container, resources: nri.LinuxResources
    ) -> list[nri.ContainerUpdate]:
        self._ensure(pod, container)
        before = convert.update_request(container, resources)

        def unhooked() -> None:
            # NRI applies kubelet's update without the hooks' changes: so does the record.
            self._put_container(pod, container)
            if before.HasField("linux"):
                merge_resources(self.store.containers[container.id].container_resources, hook_resources(before.linux))

        after = await self._through_stage(
            "UpdateContainerResources", before, v1.UpdateContainerResourcesResponse(), late_record=unhooked)
        return convert.container_update(before, after)

    async def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        self._ensure(pod, container)
        self._finish_start(container.id, started=False)
        await self._through_stage(
            "StopContainer", v1.StopContainerRequest(container_id=container.id), v1.StopContainerResponse()
        )

    async def state_change(self, event: nri.StateChangeEvent) -> None:
        pod, container = event.pod, event.container
        request: Message
        if event.event == E.RUN_POD_SANDBOX:
            reply = v1.RunPodSandboxResponse(pod_sandbox_id=pod.id)
            await self._through_stage("RunPodSandbox", convert.run_pod_request(pod), reply, recorded=True)
            # The pod runs already: what hooks answered was not applied, so
            # the store keeps the pod as the runtime has it.
            self._put_pod(pod)
        elif event.event == E.STOP_POD_SANDBOX:
            self._ensure(pod)
            request = v1.StopPodSandboxRequest(pod_sandbox_id=pod.id)
            await self._through_stage("StopPodSandbox", request, v1.StopPodSandboxResponse())
        elif event.event == E.REMOVE_POD_SANDBOX:
            request = v1.RemovePodSandboxRequest(pod_sandbox_id=pod.id)
            await self._through_stage("RemovePodSandbox", request, v1.RemovePodSandboxResponse())
        elif event.event == E.START_CONTAINER:
            self._ensure(pod, container)
            self._finish_start(container.id, started=False)  # an earlier start that never ran
            running = self._starting[container.id] = asyncio.get_running_loop().create_future()
            request = v1.StartContainerRequest(container_id=container.id)
            await self._through_stage("StartContainer", request, v1.StartContainerResponse(), until=running)
        elif event.event == E.POST_START_CONTAINER:
            self._finish_start(container.id, started=True)
        elif event.event == E.REMOVE_CONTAINER:
            self._finish_start(container.id, started=False)
            request = v1.RemoveContainerRequest(container_id=container.id)
            await self._through_stage("RemoveContainer", request, v1.RemoveContainerResponse())

    def _finish_start(self, container_id: str, *, started: bool) -> None:
        running = self._starting.pop(container_id, None)
        if running is not None and not running.done():
            if started:
                running.set_result(None)
            else:
                running.set_exception(_StartFailed(container_id))

    # ---- through the hook stage -----------------------------------------

    async def _through_stage(
        self, method: str, request: R, reply: Message, until: Awaitable[None] | None = None, recorded: bool = False,
        late_record: Callable[[], None] | None = None,
    ) -> R:
        """Run ``request`` through the hook stage; the request as the pre
        hooks left it (the stage records it and runs post hooks after; with
        ``recorded``, this returns only once it recorded)."""
        stage = self.stage.stage_for(method, "v1", "v1")
        assert stage is not None, f"{method} is a hooked method"
        issued: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def send(outgoing: bytes) -> bytes:
            if not issued.done():
                issued.set_result(outgoing)
            if until is not None:
                await asyncio.wait_for(until, START_WAIT)
            return reply.SerializeToString()

        loop = asyncio.get_running_loop()
        budget = self.budget
        deadline = REQUEST_DEADLINE.get()
        if deadline is not None:  # the runtime's own timeout for this request, if shorter
            budget = min(budget, max(deadline - loop.time() - ANSWER_MARGIN, 0.1))
        context = contextvars.copy_context()
        context.run(HOOK_DEADLINE.set, loop.time() + budget)
        task = loop.create_task(
            stage(request.SerializeToString(), self._context, send), name=f"nri-{method}", context=context
        )
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        # The hooks keep to the deadline themselves; this is the backstop.
        await asyncio.wait({issued, task}, timeout=budget + BACKSTOP, return_when=asyncio.FIRST_COMPLETED)
        if issued.done():
            if recorded:
                await asyncio.wait({task})
            return type(request).FromString(issued.result())
        if task.done():
            error = task.exception()
            if isinstance(error, HookRefused):
                raise TtrpcError(FAILED_PRECONDITION, str(error))
            if error is not None:
                raise error
            return request
        return self._late(method, request, task, budget, late_record)

    def _late(
        self, method: str, request: R, task: asyncio.Task[bytes], budget: float, late_record: Callable[[], None] | None,
    ) -> R:
        """The hooks took longer than the runtime waits: refuse if a Fail
        hook has not answered, else go on without their changes."""
        hook = HOOKED_METHODS[method].pre
        servers = self.stage.dispatcher.servers(hook) if hook is not None else ()
        strict = [server.name for server in servers if server.failure_policy is FailurePolicy.FAIL]
        if strict:
            task.cancel()
            # The same refusal as a Fail hook's own timeout (the proxy's code for it).
            raise TtrpcError(
                FAILED_PRECONDITION,
                f"runtime-proxy: {hook} hooks did not answer within {budget:g}s, the time NRI allows; "
                f"hook server {', '.join(strict)} has failure-policy Fail, so the call was refused",
            )
        log.warning(
            "hooks did not answer in the time NRI allows; going on without their changes",
            extra={"method": method, "budget": budget},
        )
        if hook is not None and HOOK_POINTS[hook].answer_applied:
            # The runtime goes on without the hooks' changes: answered later,
            # they must not be recorded as applied (a StartContainer's task
            # goes on: it has no change to apply, and its post hooks to run).
            # ``late_record`` records the call as the runtime applies it; a
            # created container is recorded at its next event (_ensure), a
            # pod by state_change.
            task.cancel()
            if late_record is not None:
                late_record()
        return request

    def _forget(self, task: asyncio.Task[bytes]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not isinstance(error, (HookRefused, _StartFailed, TimeoutError)):
            log.error("hooked NRI event failed", extra={"task": task.get_name(), "error": repr(error)})

    async def idle(self) -> None:
        """Until the events' stage tasks started so far are done."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self) -> None:
        """Shutdown: pending starts give up; started post hooks finish."""
        self.disconnected()
        await self.idle()
        await self.stage.drain()


__all__ = ["SUBSCRIBED", "HookAdapter", "HookRefused"]
