"""Calling hook servers: in order, each bounded by its timeout and policy."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc
from grpc import aio

from ..hookclient.transport import CallFailed, HookTransport, NoMessage, Untrusted, transport_for
from ..metrics import Metrics
from ..outages import HOOK_SERVER, OutageLog
from .answers import UNAPPLIED_FIELDS, kernel_would_refuse, refusal, unapplied
from .chaincpuset import ChainCpusets, Deferred
from .hookfile import MAX_TIMEOUT, FailurePolicy, HookServerConfig
from .nodefacts import NodeFactsSource
from .points import HOOK_POINTS, HookPoint, HookType
from .registry import HookSnapshot, HookSource

log = logging.getLogger(__name__)

CLOSE_GRACE = MAX_TIMEOUT + 5.0  # calls under way on a removed server may take their whole timeout


class Unbuilt(Exception):
    """The hook request could not be built: no record of the object and
    none read from the runtime (a failed or undecodable read)."""


class HookError(Exception):
    """A pre hook with failure-policy Fail did not answer; the call is refused."""

    def __init__(self, server: HookServerConfig, hook: HookType, cause: str) -> None:
        super().__init__(server.name, hook.value, cause)
        self.server, self.hook, self.cause = server, hook, cause

    def __str__(self) -> str:
        return (
            f"hook server {self.server.name} ({self.server.endpoint}) failed {self.hook.value}: {self.cause}; "
            f"failure-policy Fail, so the call was not sent to the runtime"
        )


class Dispatcher:
    def __init__(
        self,
        registry: HookSource,
        metrics: Metrics | None = None,
        *,
        node: NodeFactsSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        transport: HookTransport | None = None,
        clears_cpusets: bool = True,
    ) -> None:
        self.registry = registry
        # Whether a whole answer's empty cpuset clears the call's (False under
        # NRI, which cannot clear one): the stage applies it so, a chain judges it so.
        self.clears_cpusets = clears_cpusets
        self._metrics = metrics
        self._node = node  # None: pre-hook answers are not checked against the node
        self._outages = OutageLog(log, HOOK_SERVER, clock=clock)
        self.transport = transport or transport_for("frames")
        # _note_unapplied's, once each: by the file as the registry's snapshot
        # holds it, so an edited one is logged again (and not by the config
        # called: under NRI a chain's server may get a new timeout each call).
        self._unapplied_noted: set[tuple[HookServerConfig, HookType]] = set()
        registry.on_change(self._forget_removed)

    def servers(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        return self.registry.servers_for(hook)

    def has_servers(self) -> bool:
        """Whether any hook server is registered, for any hook point."""
        return len(self.registry.snapshot) > 0

    def _forget_removed(self, snapshot: HookSnapshot) -> None:
        self._outages.keep_only(snapshot.servers)
        self._unapplied_noted = {noted for noted in self._unapplied_noted
                                 if snapshot.servers.get(noted[0].name) == noted[0]}
        if self._metrics is not None:
            self._metrics.keep_hook_stats(snapshot.servers)
        # Calls already under way on a removed server finish (each is bounded
        # by its timeout); its connection closes after them.
        self.transport.keep_only(snapshot.endpoints, CLOSE_GRACE)

    async def close(self) -> None:
        await self.transport.close(CLOSE_GRACE)

    async def call(
        self, server: HookServerConfig, hook: HookType, request: Any, chain: ChainCpusets | None = None
    ) -> Any:
        """One hook call; raises ``_Failure`` with a readable cause. In a
        PreCreateContainer ``chain``, an answer refused only by its parent may
        be taken until the chain's end (chaincpuset.py), and counted then."""
        started = time.perf_counter()
        outcome: str | None = "ok"
        cause: str | None = None  # a failure's, for `status`
        caller_cancelled = False  # the CRI call was: not the server's failure
        try:
            point = HOOK_POINTS[hook]
            # The transport judges the socket (hookclient/endpointtrust.py) as it dials:
            # it may have been replaced since the file was read.
            raw = await self.transport.call(
                server.endpoint, point.full_method, request.SerializeToString(), server.timeout, server.owner_uid
            )
            try:
                answer = point.response_type.FromString(raw)
            except Exception as err:  # DecodeError, or not bytes at all
                outcome = "invalid_answer"
                raise _Failure(f"answer is not a valid {point.response_type.__name__}: {err}") from None
            if not point.answer_applied or hook in UNAPPLIED_FIELDS:
                self._note_unapplied(server, point, answer)
            along = chain.taken_along(server, request, answer) if chain is not None else {}
            refused = kernel_would_refuse(self._node, point, request, answer, along)
            if chain is not None and chain.defers(server, refused):
                outcome = None
                chain.defer(server, request, answer, refused, along, time.perf_counter() - started)
                return answer
            if refused:
                # Sent on, such a value fails the container deep in runc,
                # naming neither the hook nor the field: name both here.
                outcome = "invalid_value"
                raise _Failure(refusal(refused))
            return answer
        except Untrusted as err:
            outcome, cause = "untrusted_endpoint", err.reason  # no call was made
            raise _Failure(err.reason) from None
        except CallFailed as err:
            outcome = err.code.name.lower()
            if isinstance(err, NoMessage):
                outcome, cause = "invalid_answer", err.details  # answered, but nothing to decode
            elif err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                cause = f"no answer within {server.timeout:g}s"
            else:
                cause = f"{err.code.name}: {err.details}"
            raise _Failure(cause) from err
        except asyncio.CancelledError:
            outcome = "cancelled"  # counted either way: not an answer
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Whoever cancels gives no reason along: name every one.
                cause = ("the CRI call was cancelled (its client, kubelet or NRI, gave up or sent too long a request; "
                         "the runtime ended it or closed its connection; or the proxy stops)")
                caller_cancelled = True
                raise  # our caller is being cancelled: not the hook's failure
            cause = "hook call cancelled (its connection was closed)"
            raise _Failure(cause) from None
        except _Failure as failure:
            cause = failure.cause
            raise
        except Exception as err:  # whatever goes wrong with one hook call is that hook's failure
            outcome = "error"
            log.debug("unexpected error calling hook", exc_info=True, extra=server.log_fields())
            cause = f"{type(err).__name__}: {err}"
            raise _Failure(cause) from err
        finally:
            if self._metrics is not None and outcome is not None:
                # _value_: the member's own attribute; .value is a property through enum's descriptor, at each call.
                self._metrics.hook_call(
                    server.name, hook._value_, outcome, time.perf_counter() - started, cause,
                    caller_cancelled=caller_cancelled,
                )

    def _note_unapplied(self, server: HookServerConfig, point: HookPoint, answer: Any) -> None:
        """An answer that sets fields where none is applied, or fields its call
        has no place for, logged once per file and hook point: else its author
        sees the call go on unchanged and no word why (a post hook's,
        PreStartContainer's, PreUpdateContainerResources' env)."""
        found = unapplied(point, answer)
        if found is None:
            return
        # The snapshot's config, which _forget_removed compares: the one
        # called may be a copy with the time left for its timeout (nri/limits.py's
        # _Chain), a new one each call, which noted so would log every call and
        # keep one entry per call. (Itself for a server removed since: the next
        # change forgets it.)
        noted = (self.registry.snapshot.servers.get(server.name, server), point.hook)
        if noted in self._unapplied_noted:
            return
        self._unapplied_noted.add(noted)
        fields, message = found
        log.info(message, extra={**server.log_fields(), "hook": point.hook.value, "answer_fields": ",".join(fields)})

    async def run_pre(
        self,
        hook: HookType,
        build: Callable[[], Awaitable[Any]],
        apply: Callable[[Any, HookServerConfig], bool],
        log_fields: dict[str, object],
    ) -> bool:
        """Chain every server of ``hook``; each sees the request as the
        previous one left it (``apply`` takes each answer with the server
        that gave it: whether it changed the call). Returns whether any
        answer changed the call."""
        # PreCreateContainer's parent and cpusets are judged as the chain leaves them too.
        chain = None
        if hook is HookType.PRE_CREATE_CONTAINER and self._node is not None:
            chain = ChainCpusets(log_fields, self.clears_cpusets)
        try:
            changed = await self._chain(hook, build, apply, log_fields, chain)
            if chain is not None and chain.deferred:
                self._judge_chain(hook, chain)
            return changed
        except HookError:
            raise  # another hook's refusal: the deferred answers are refused as judged (below)
        except (asyncio.CancelledError, aio.AbortError) as err:
            # The call cancelled, or refused by the outage gate between pre
            # hooks (hookpath/prehooks.py: grpc's context.abort raises AbortError):
            # its deferred answers were never judged, through no fault of theirs.
            if chain is not None:
                ended = "was cancelled" if isinstance(err, asyncio.CancelledError) else "was refused by the outage gate"
                self._count_deferred(hook, chain.deferred, "cancelled",
                                     f"the CRI call {ended} before its chain was judged", caller_cancelled=True)
            raise
        except Exception as err:
            # The proxy's own failure (a build or an apply that raised): its
            # deferred answers were never judged, and the count says so
            # rather than hide it among cancelled calls.
            if chain is not None:
                self._count_deferred(hook, chain.deferred, "error",
                                     f"the chain ended before it was judged: {type(err).__name__}: {err}")
            raise
        finally:
            if chain is not None:  # cut short by another hook's refusal: refused as judged
                self._count_deferred(hook, chain.deferred, "invalid_value")

    async def _chain(
        self, hook: HookType, build: Callable[[], Awaitable[Any]],
        apply: Callable[[Any, HookServerConfig], bool],
        log_fields: dict[str, object], chain: ChainCpusets | None,
    ) -> bool:
        changed = False
        servers = self.servers(hook)
        for index, server in enumerate(servers):
            if self._removed(server, hook):
                continue
            # Built only for a server to be called: a build follows the calls
            # before it (the outage gate's refusal in it says which: hookpath/prehooks.py).
            try:
                request = await build()
            except Unbuilt:
                self._unbuilt(hook, servers[index:], log_fields)
                return changed
            if request is None:  # nothing to hook: an object the runtime does not have (it refuses the call)
                return changed
            deferred = 0
            if chain is not None:
                chain.later = index < len(servers) - 1
                deferred = len(chain.deferred)
            try:
                answer = await self.call(server, hook, request, chain)
            except _Failure as failure:
                if self._removed(server, hook):  # removed while it was called (its connect cancelled, say)
                    continue
                fields = {**log_fields, **server.log_fields()}
                if server.failure_policy is FailurePolicy.FAIL:
                    # Every refused CRI call is logged: it is what kubelet sees.
                    log.error("hook failed, refusing call", extra={**fields, "error": failure.cause})
                    self._outages.counted(server.name)  # so its recovery is logged, with every failure counted
                    raise HookError(server, hook, failure.cause) from failure
                self._outages.failed(
                    server.name, logging.WARNING, f"hook failed, going on without it: {failure.cause}",
                    {**fields, "error": failure.cause},
                )
                continue
            if chain is None or len(chain.deferred) == deferred:
                # A deferred answer is no success yet: its outage ends, or not, as it is judged at the chain's end.
                self._succeeded(server, log_fields)
            changed = apply(answer, server) or changed
            if chain is not None:
                try:
                    chain.taken(server, request, answer)
                except Exception as err:  # its answer is in the call: the chain cannot be judged without it
                    self._judging_failed(hook, chain, server, err)
        return changed

    def _judge_chain(self, hook: HookType, chain: ChainCpusets) -> None:
        """The answers taken though refused by their parent, judged by the call
        as the chain left it; the last that stands fails the call (each is Fail)."""
        assert self._node is not None
        try:
            standing = chain.standing(self._node)
        except Exception as err:  # a read gone wrong is the last deferred answer's failure: the proxy goes on
            self._judging_failed(hook, chain, chain.deferred[-1].server, err)
        judged = {id(entry) for entry, _ in standing}
        passed = [entry for entry in chain.deferred if id(entry) not in judged]
        for entry in passed:  # a later hook's move or cpuset, a whole answer's clear, a parent widened meanwhile
            log.debug("answer outside its parent cgroup taken: the call as the chain left it fits its parent",
                      extra={**chain.log_fields, **entry.server.log_fields()})
        self._count_deferred(hook, passed, "ok")
        for entry in passed:  # an answer that stands is the call's success: its server's outage, if any, ends
            self._succeeded(entry.server, chain.log_fields)
        for entry, reasons in standing:  # refused, each for its own cpusets' reasons (the CPUs outside)
            self._count_deferred(hook, [entry], "invalid_value", refusal(reasons))
        if standing:
            blamed, reasons = standing[-1]  # the later hook, whose answer completed the refused pair
            cause = refusal(reasons)
            log.error("hook failed, refusing call", extra={**chain.log_fields, **blamed.server.log_fields(), "error": cause})
            self._outages.counted(blamed.server.name)  # a refused call, as any other Fail hook's
            raise HookError(blamed.server, hook, cause)

    def _judging_failed(self, hook: HookType, chain: ChainCpusets, server: HookServerConfig, err: Exception) -> NoReturn:
        """Judging the chain's cpusets went wrong (a read, say): the call is
        refused naming ``server``, its deferred answers counted ``error``."""
        cause = f"{type(err).__name__}: {err}"
        fields = {**chain.log_fields, **server.log_fields()}
        log.debug("unexpected error judging the chain's cpusets", exc_info=err, extra=fields)
        log.error("hook failed, refusing call", extra={**fields, "error": cause})
        self._count_deferred(hook, chain.deferred, "error", cause)
        self._outages.counted(server.name)
        raise HookError(server, hook, cause) from err

    def _count_deferred(
        self, hook: HookType, entries: list[Deferred], outcome: str, cause: str | None = None, *,
        caller_cancelled: bool = False,
    ) -> None:
        """Count each deferred answer's call once, with ``outcome`` (and
        ``cause``; a refusal's names the entry's cpusets; ``caller_cancelled``:
        no failure of its server's, as in :meth:`call`)."""
        for entry in entries:
            if entry.counted:
                continue
            entry.counted = True
            if self._metrics is not None:
                why = cause
                if why is None and outcome == "invalid_value":
                    why = f"its {', '.join(sorted(entry.fields))} outside the parent cgroup's, as the chain left the call"
                self._metrics.hook_call(
                    entry.server.name, hook.value, outcome, entry.seconds, why, caller_cancelled=caller_cancelled,
                )

    async def run_post(self, hook: HookType, request: Any, log_fields: dict[str, object]) -> None:
        """Post hooks inform; their failures are logged, never returned."""
        for server in self.servers(hook):
            if self._removed(server, hook):
                continue
            try:
                await self.call(server, hook, request)
            except _Failure as failure:
                fields = {**log_fields, **server.log_fields()}
                self._outages.failed(
                    server.name, logging.WARNING, f"post hook failed: {failure.cause}", {**fields, "error": failure.cause}
                )
                continue
            self._succeeded(server, log_fields)

    def _succeeded(self, server: HookServerConfig, log_fields: dict[str, object]) -> None:
        """A hook call of ``server`` answered: its outage, if it had one, ends (logged with the call's fields)."""
        if self._outages.down(server.name):  # (the fields are made only then: nearly every call has none)
            self._outages.succeeded(server.name, {**log_fields, **server.log_fields()})

    def _removed(self, server: HookServerConfig, hook: HookType) -> bool:
        """Whether ``server`` left the chain since it began (its file removed
        or changed while an earlier hook answered): not called then, rather
        than failing the call for a server the operator took out. (Matched by
        file and endpoint: a server may come with its timeout cut to the
        time left, nri/limits.py.)"""
        for current in self.servers(hook):  # (a loop, not any(): once per hook call)
            if current is server or (current.name == server.name and current.endpoint == server.endpoint):
                return False
        log.info("hook server removed while a call was in its chain; not called",
                 extra={"hook": hook.value, **server.log_fields()})
        return True

    def _unbuilt(self, hook: HookType, servers: tuple[HookServerConfig, ...], log_fields: dict[str, object]) -> None:
        """The hook request could not be built (no record of the object, and
        the runtime could not be read): a Fail server still to be asked
        refuses the call, as if it had not answered; Ignore ones are skipped."""
        strict = [s for s in servers if s.failure_policy is FailurePolicy.FAIL and not self._removed(s, hook)]
        cause = "the proxy has no record of the pod or container and could not read it from the runtime"
        if strict:
            log.error("hook request not built, refusing call", extra={**log_fields, **strict[0].log_fields(), "error": cause})
            raise HookError(strict[0], hook, cause)
        log.warning("hook request not built; its hooks are skipped", extra={**log_fields, "hook": hook.value, "error": cause})


class _Failure(Exception):
    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause
