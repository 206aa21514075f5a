"""The hooked path of a CRI call: decode, pre hooks, merge, backend, record, post hooks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi

from ..cripath.forward import issue
from ..cripath.stage import Send, Stage, StageProvider, answer_at_once, request_sent
from ..metrics import Metrics
from ..supervisor import Supervisor, TaskName
from .dispatch import Dispatcher, HookError
from .executor import HOOKED_METHODS, HookedMethod
from .executorbase import Executor
from .hookfile import FailurePolicy
from .locks import KeyedLocks
from .points import HookType
from .prehooks import PreHooks
from .registry import HookSnapshot
from .settling import Unsettled
from .store import StateStore
from .undecodable import Undecodable, undecodable
from .wholeanswers import WholeAnswers

log = logging.getLogger(__name__)
_NOTHING = contextlib.nullcontext()  # reusable: it keeps no state
_FAIL = FailurePolicy.FAIL  # (a module global: an Enum class attribute is looked up through the metaclass)


# How long a pre hook may wait for the post hooks of its object still running
# (seconds; None: until they end, each bounded by its own timeout).
OrderWait = Callable[[HookType], "float | None"]


class HookStage(StageProvider):
    def __init__(
        self, dispatcher: Dispatcher, store: StateStore, metrics: Metrics | None = None, tasks: Supervisor | None = None,
        order_wait: OrderWait | None = None, carries: bool = True,
    ) -> None:
        self.dispatcher = dispatcher
        # Whether a whole answer's empty cpuset clears the call's: the dispatcher's word (not under NRI).
        self._whole = WholeAnswers(dispatcher.clears_cpusets)
        # Whether calls carry earlier hooks' changes (Executor.carry); not
        # under NRI, which never applies a PreRunPodSandbox answer.
        self._carries = carries
        self._order_wait = order_wait
        self._tasks = tasks or Supervisor()
        self.store = store
        self._metrics = metrics
        self.locks = KeyedLocks()
        # The newest post-hook task of each key (see _event_keys): the next
        # pre hook on that key is sent after it has finished.
        self._post_hooks: dict[str, asyncio.Task[None]] = {}
        # Successful calls being recorded by their handler, and those whose
        # client left before they were recorded (see settle).
        self._recording = Unsettled()
        self._finishing: set[asyncio.Task[None]] = set()
        self._rechecks: set[asyncio.Task[None]] = set()  # removals whose outcome is being asked again
        # A call that keeps state went by unrecorded (``needed``): the records
        # are dropped, and read again from the runtime when a hook server next comes.
        self._unrecorded = False  # (only ever set while no hook server is registered)
        dispatcher.registry.on_change(self._servers_changed)

    def stage_for(self, method: str, client_version: str, backend_version: str) -> Stage | None:
        point = HOOKED_METHODS.get(method)
        return None if point is None else functools.partial(self._run, point)

    def needed(self, method: str) -> bool:
        """A call has work here only while a hook server is registered (for
        any point: the calls held for hooks keep the calls on their object
        behind them), or while a call holds or awaits an object's lock: this
        call may be on that object, and must not pass the calls waiting
        there. Else even a call that keeps state (a creation, a removal) is
        relayed as it is, unrecorded: nobody needs the records until a hook
        server comes, and they are read again from the runtime then. But a
        resource update, which a read back under way when a server comes
        must be told of (``Executor.recorded_without_hooks``)."""
        point = HOOKED_METHODS.get(method)
        if point is None:
            return False
        if self.dispatcher.has_servers() or len(self.locks) > 0 or point.executor.recorded_without_hooks:
            return True
        if point.keeps_state and not self._unrecorded:
            # From now on the records would go out of date: none are kept.
            self._unrecorded = True
            self.store.forget_all()
        return False

    def refresh_records(self) -> None:
        """The runtime (re)connected: read the records again from it, unless
        none are kept (calls went by unrecorded): a hook server's coming reads
        them then."""
        if not self._unrecorded:
            self._tasks.spawn(TaskName.REBUILD, self.store.rebuild_quietly())

    def _servers_changed(self, snapshot: HookSnapshot) -> None:
        # (``_unrecorded`` is set only while no server is registered: a server
        # here with it set is the first since.)
        if len(snapshot) > 0 and self._unrecorded:
            # Calls went by unrecorded while no hook server was registered:
            # read the records again, as at start-up (what a hook needs first
            # is read back on demand). A removal still at the runtime may be
            # read as alive: its record goes at the next resync.
            self._unrecorded = False
            self.store.forget_all()
            self._tasks.spawn(TaskName.REBUILD, self.store.rebuild_quietly())
            log.info("a hook server came after calls went unrecorded: state is read again from the runtime")

    def sends_unchanged(self, method: str) -> bool:
        """No pre hook can change the call (nor one's answer on its object be
        carried into it: ``Executor.carry``), no call holds or awaits a lock it
        could pass, and no Fail hook must see it before it goes (a request
        the proxy cannot decode is refused then): the runtime may have it at
        once, while the call is decoded and its record built."""
        point = HOOKED_METHODS.get(method)
        if point is None or len(self.locks) > 0:
            return False
        if (point.pre is not None and self.dispatcher.servers(point.pre)) or self._carrying(point.executor):
            return False
        if point.post is not None:
            for server in self.dispatcher.servers(point.post):  # (a loop: asked at every hooked call)
                if server.failure_policy is _FAIL:
                    return False
        return True

    def _carrying(self, ex: Executor) -> bool:
        """The same answer for both data paths, whatever else is in flight.

        While any hook server is registered (records are kept only then), not
        only one for ``carries_from``: a pod that a server since removed (or one
        before a restart) moved still has its containers follow it."""
        return self._carries and ex.carries_from is not None and self.dispatcher.has_servers()

    async def _run(self, point: HookedMethod, request: bytes, context: aio.ServicerContext, send: Send) -> bytes:
        started = time.perf_counter()
        outcome: str | None = "error"
        try:
            # A call the runtime has already: shutdown's settle waits for it, as for a record.
            with self._recording if request_sent(context) else _NOTHING:
                reply = await self._hooked(point, request, context, send)
            outcome = "ok"
            return reply
        except Undecodable as refusal:
            # Counted before the answer leaves: abort sends it at once.
            self._count(point, "undecodable", started)
            outcome = None
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refusal))
            raise  # unreachable: abort raises
        finally:
            if outcome is not None:
                self._count(point, outcome, started)

    def _recheck(self, ex: Executor, req: Message, fields: dict[str, object]) -> None:
        """The runtime may or may not have done the call: its records are made true in the background."""
        if type(ex).unsure is Executor.unsure:
            return
        task = self._tasks.spawn(TaskName.RECHECK, ex.unsure(req, self.store), fields=fields)
        self._rechecks.add(task)
        task.add_done_callback(self._rechecks.discard)

    async def rechecked(self) -> None:
        """Until the rechecks started so far are done (tests, shutdown)."""
        if self._rechecks:
            await asyncio.wait(set(self._rechecks))

    def _count(self, point: HookedMethod, outcome: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.hooked_call(point.method, outcome, time.perf_counter() - started)

    async def _hooked(self, point: HookedMethod, request: bytes, context: aio.ServicerContext, send: Send) -> bytes:
        ex = point.executor
        try:
            req = ex.request.FromString(request)  # the v1 class reads v1alpha2 bytes too
        except DecodeError as exc:
            return await undecodable(self.dispatcher, point, request, exc, context, send)
        key = ex.key(req)
        fields: dict[str, object] = {"method": point.method, "key": key}
        sent = request_sent(context)
        # A call the runtime has already takes its lock all the same (free: no
        # call held or awaited one when it was read), so that the calls on its
        # object that come after it wait for it, as they would for any call.
        sending = False
        release: Callable[[], None] | None = None
        try:
            release = self.locks.try_acquire(key) or await self.locks.acquire(key)  # (free: no coroutine)
            # A request the runtime has already: pre hooks are too late for it
            # (a server registered since it was read sees the next call).
            pre_hook = point.pre if point.pre is not None and not sent and self.dispatcher.servers(point.pre) else None
            post_hook = point.post if point.post is not None and self.dispatcher.servers(point.post) else None
            if pre_hook or post_hook:
                skips = ex.skips(req, self.store)
                if skips is None:  # (rarely: the record that says is read from the runtime)
                    skips = await ex.read_skips(req, self.store)
                if skips:
                    log.debug("pod opted out of hooks", extra=fields)
                    pre_hook = post_hook = None
            changed = False
            if not sent and self._carrying(ex):
                # Read back a pod the records lack only if a hook may move pods now, or
                # a pre hook reads it anyway: else the call is not held for the runtime.
                read_back = pre_hook is not None or (  # (carries_from is set: _carrying)
                    ex.carries_from is not None and bool(self.dispatcher.servers(ex.carries_from)))
                changed = await ex.carry(req, self.store, read_back)
            # What record() takes as ``seen``: the hook request the last pre
            # hook was sent, if the call is still what it was built from.
            record_from: Any = None
            if pre_hook is not None:
                pending = self._post_hooks.get(key)
                if pending is not None:  # (rarely: no coroutine made for nothing to wait for)
                    await self._post_hooks_done(pending, pre_hook, fields)
                pre = PreHooks(ex, req, key, pre_hook, self.store, self._whole, context, fields)
                try:
                    changed = await self.dispatcher.run_pre(
                        pre_hook, build=pre.build, apply=pre.apply, log_fields=fields) or changed
                except HookError as err:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"runtime-proxy: {err}")
                record_from = pre.seen
            elif sent and not self._unrecorded:
                record_from = ex.early_seen(req, self.store)  # built while the runtime works, not after it answered
            outgoing = req.SerializeToString() if changed else request
            # Asked when the answer comes (a stop may take its grace period):
            # then nothing below can change the answer or wait on the runtime.
            answer_at_once(context, functools.partial(self._answers_at_once, ex, req, record_from, post_hook is not None))
            sending = True
            try:
                if ex.ordered_until_issued:
                    # A stop waits out the grace period kubelet chose; the next
                    # call on this object (a CPU manager update, say) goes once
                    # the stop's request has been written to the runtime's
                    # connection (so it reaches the runtime first), without
                    # waiting for the stop to end.
                    backend_call = await issue(send, outgoing)
                    release()
                    release = None
                    reply = await backend_call
                else:
                    reply = await send(outgoing)
            except BaseException:
                self._recheck(ex, req, fields)
                raise
            try:
                response = ex.response.FromString(reply) if ex.reads_response else None
            except DecodeError:  # the runtime did the work: answer, just remember less
                log.warning("runtime answer does not decode; state not recorded", extra=fields)
                return reply
            try:
                with self._recording:
                    await self._succeeded(ex, req, response, key, post_hook, fields, record_from)
            except asyncio.CancelledError:
                # The runtime answered and only then the client left (a
                # deadline, a cancel), while the state was read back. The
                # store and the post hooks must not miss the call: finish in
                # the background, still in order with the next call on this
                # object. (A client that leaves before the runtime answered
                # cancels the runtime call, as it would without the proxy.)
                self._finish_in_background(
                    self._succeeded(ex, req, response, key, post_hook, fields, record_from), release, fields
                )
                release = None
                raise
            return reply
        except BaseException:
            # Failed or cancelled (waiting for its lock, say) before it asked
            # for the answer: the runtime may have acted.
            if sent and not sending:
                self._recheck(ex, req, fields)
            raise
        finally:
            if release is not None:
                release()

    def _answers_at_once(self, ex: Executor, req: Message, seen: Any, post: bool) -> bool:
        """``answer_at_once``'s question, asked when the runtime answers."""
        return self._unrecorded or ex.records_at_once(req, self.store, seen, post)

    async def _succeeded(
        self, ex: Executor, req: Message, response: Message | None, key: str, post_hook: HookType | None,
        fields: dict[str, object], seen: Any = None,
    ) -> None:
        """Record a successful call and start its post hooks. Safe to run again
        after a cancel: records are put, not added, and post hooks start last,
        after the final await. None are kept while calls go by unrecorded."""
        if self._unrecorded:
            return  # (no hook server either: no post hook)
        if not ex.record(req, response, self.store, seen):  # (rarely: a record it needs is read)
            await ex.read_record(req, response, self.store, seen)
        if post_hook is not None:
            post_request = ex.hook_request(req, self.store)
            if post_request is None:
                post_request = await ex.read_hook_request(req, self.store)
            if post_request is not None:
                self._start_post_hooks(_event_keys(key, post_request, self.store), post_hook, post_request, fields)

    def _finish_in_background(
        self, work: Coroutine[Any, Any, None], release: Callable[[], None] | None, fields: dict[str, object]
    ) -> None:
        task = self._tasks.spawn(TaskName.FINISH, work, drain=True, fields=fields)
        self._finishing.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            # A callback, not a finally: it runs even if the task is
            # cancelled before it started.
            self._finishing.discard(finished)
            if release is not None:
                release()
            if finished.cancelled():
                log.warning("recording a finished call was cancelled; state is read back on demand", extra=fields)

        task.add_done_callback(done)

    def _start_post_hooks(self, keys: tuple[str, ...], hook: HookType, request: object, fields: dict[str, object]) -> None:
        """Post hooks only inform, so neither the client's answer nor the next
        call on this object waits for them; only the next hook event does."""
        previous: set[asyncio.Task[None]] = set()
        for key in keys:  # (a loop: a comprehension is a function, its walrus a cell, made per post hook)
            earlier = self._post_hooks.get(key)
            if earlier is not None:
                previous.add(earlier)
        # Nearly always none is left: the task is the hooks' own coroutine, no wrapper to go through at each step.
        if previous:
            work = self._run_post_after(previous, hook, request, fields)
        else:
            work = self.dispatcher.run_post(hook, request, fields)
        task = self._tasks.spawn(TaskName.POST_HOOK, work, drain=True, fields={**fields, "hook": hook._value_})
        for key in keys:
            self._post_hooks[key] = task
        task.add_done_callback(functools.partial(self._forget_post_hooks, keys))

    async def _run_post_after(
        self, previous: set[asyncio.Task[None]], hook: HookType, request: object, fields: dict[str, object]
    ) -> None:
        await asyncio.wait(previous)
        await self.dispatcher.run_post(hook, request, fields)

    def _forget_post_hooks(self, keys: tuple[str, ...], done: asyncio.Task[None]) -> None:
        for key in keys:
            if self._post_hooks.get(key) is done:
                del self._post_hooks[key]

    async def _post_hooks_done(self, pending: asyncio.Task[None], hook: HookType, fields: dict[str, object]) -> None:
        limit = self._order_wait(hook) if self._order_wait is not None else None
        done, _ = await asyncio.wait([pending], timeout=limit)
        if not done:
            # Under NRI the event's time is fixed: the pre hook, which changes
            # the container, goes first rather than lose its answer to the wait.
            log.info("pre hook sent before an earlier post hook of its object ended: no time left to wait",
                     extra={**fields, "hook": hook.value, "waited_s": limit})

    async def settle(self) -> None:
        """Shutdown, after the server stopped: finish recording the calls the
        runtime answered, while the backend can still be read (each read is
        bounded by the proxy's read timeout). Their handlers may outlive the
        server's stop, or hand the work to a background task when cancelled."""
        while self._recording.count or self._finishing:
            await self._recording.none.wait()
            if self._finishing:
                await asyncio.wait(set(self._finishing))

    async def drain(self) -> None:
        """Shutdown: let started post hooks finish (each bounded by its timeout)."""
        await self.settle()  # these may start post hooks
        if self._post_hooks:
            await asyncio.wait(set(self._post_hooks.values()))


def _event_keys(key: str, request: object, store: StateStore) -> tuple[str, ...]:
    """The keys a post-hook event is ordered under: its call's key, and the
    key of the next pre hooks that must come after it. For a pod, its uid
    (RunPodSandbox's key): a recreated sandbox's PreRunPodSandbox comes after
    the old one's PostStopPodSandbox. For a container, its sandbox id
    (CreateContainer's and the pod calls' key): a restarted container's
    PreCreateContainer, and the pod's own post hooks, come after it."""
    if isinstance(request, hookapi.PodSandboxHookRequest):
        also = request.pod_meta.uid
    else:
        also = store.container_pod.get(key, "")
    return (key, also) if also and also != key else (key,)
