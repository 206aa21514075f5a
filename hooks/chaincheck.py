"""What the proxy would make of a chain of hooks' answers at one hook point:
:func:`check_chain` (also importable from :mod:`hooks.sdk`), for a hook
author whose hook runs beside others (koordlet's, a second one of theirs).

It runs the proxy's own hook stage (``hookpath.stage.HookStage``, its
``Dispatcher``, executor, merge, whole-answer clears and PreCreateContainer's
chain cpuset judgement, ``hookpath.chaincpuset``) on kubelet's call, with a
stand-in transport that answers each hook file's call with the answer given
for it. The hook files are ordered as the proxy orders them (priority, then
file name); each hook is shown the request as the hooks before it left the
call; each answer is taken, or refused by its failure policy (``Fail``: the
call; ``Ignore``: the answer alone), as the proxy does. A field of the call
is credited to the last hook whose answer changed it: the answers taken are
applied again, unjudged, one more at each run, and each field's change
found between consecutive runs.

The proxy's own lines for the chain are logged as it logs them (a refused
answer's ``hook failed, going on without it``, at warning).

Judged: the CRI proxy's path (``runtime-proxy serve``), at the hook points
whose answer is applied (PreRunPodSandbox, PreCreateContainer,
PreUpdateContainerResources). Not judged: the transport (a hook that does
not answer in time is its failure policy's), and ``runtime-proxy nri``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from hooks.checkfacts import cgroup_hierarchy, kubelet_call, node_facts
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.hookfile import Answers, FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.merge import copy_as_wire
from runtimeproxy.hookpath.nodefacts import NodeFactsSource
from runtimeproxy.hookpath.points import HOOK_POINTS, HookPoint, HookType
from runtimeproxy.hookpath.registry import ChangeCallback, HookSnapshot
from runtimeproxy.hookpath.stage import HookStage
from runtimeproxy.hookpath.store import StateStore
from runtimeproxy.metrics import Metrics

__all__ = ["ChainCheck", "ChainField", "ChainHook", "HookResult", "check_chain"]

POD_ID, CONTAINER_ID = "check-chain-pod", "check-chain-container"


@dataclass(frozen=True)
class ChainHook:
    """One hook file of the chain and its answer (None: an empty one)."""

    name: str  # the hook file's name ("koordlet.json"): with priority, its place in the chain
    answer: Message | None
    failure_policy: FailurePolicy | str = FailurePolicy.IGNORE  # the hook file's default
    priority: int = 0
    answers: Answers | str = Answers.CHANGES


@dataclass(frozen=True)
class HookResult:
    name: str
    outcome: str  # the proxy's metric outcome: "ok", "invalid_value", "cancelled"...; "not called" after a refusal
    cause: str | None  # a refusal's, as ``runtime-proxy status`` names it
    shown: Message | None  # the request it was shown (the call as the hooks before it left it); None: not called


@dataclass(frozen=True)
class ChainField:
    field: str  # the CRI call's field: "config.linux.resources.cpu_shares", "config.envs[HOOKED_BY]"
    value: Any  # as the call goes to the runtime (None: cleared)
    set_by: str  # the last hook file whose answer changed it


@dataclass(frozen=True)
class ChainCheck:
    hook: HookType
    hooks: tuple[HookResult, ...]  # in the proxy's order
    fields: tuple[ChainField, ...]  # the call's fields the chain changed
    refusal: str | None  # what kubelet is told when a Fail hook refuses the call; None: it goes on
    sent: Message | None  # the CRI call as it goes to the runtime; None: refused

    @property
    def winners(self) -> dict[str, str]:
        """Each changed field's hook file: one assert for the chain."""
        return {change.field: change.set_by for change in self.fields}

    def __str__(self) -> str:
        lines = [f"{self.hook.value} chain: {'call refused: ' + self.refusal if self.refusal else 'call goes on'}"]
        lines += [f"  {h.name}: {h.outcome}{f' ({h.cause})' if h.cause else ''}" for h in self.hooks]
        lines += [f"  {c.field} = {c.value!r} (from {c.set_by})" for c in self.fields]
        return "\n".join(lines)


async def check_chain(
    hook: HookType | str,
    request: Message,
    chain: Sequence[ChainHook | tuple[str, Message | None]],
    *,
    call: Message | None = None,
    cpus: str | None = None,
    mems: str | None = None,
    cgroups: Mapping[str, Mapping[str, str]] | None = None,
) -> ChainCheck:
    """What the proxy would make of ``chain``'s answers to a call that shows
    the first hook ``request``. ``chain``: ChainHook or (file name, answer)
    (policy Ignore, priority 0, answers "changes"); ``call``, ``cpus``,
    ``mems`` and ``cgroups`` as :func:`hooks.sdk.check_answer` takes them."""
    point = HOOK_POINTS[HookType(hook)]
    if not point.answer_applied:
        raise ValueError(f"{point.hook.value} answers are not applied: a chain there changes nothing")
    if not isinstance(request, point.request_type):
        raise TypeError(f"a {point.hook.value} request is a {point.request_type.__name__}, "
                        f"not {type(request).__name__}")
    hooks = [entry if isinstance(entry, ChainHook) else ChainHook(*entry) for entry in chain]
    if len({h.name for h in hooks}) != len(hooks):
        raise ValueError("each hook file of a chain has its own name")
    servers = {h.name: _server(point, h) for h in hooks}
    ordered = HookSnapshot(servers).servers_for(point.hook)  # the proxy's order
    by_name = {h.name: h for h in hooks}
    facts = node_facts(cpus, mems)
    with cgroup_hierarchy(cgroups) as parents:
        full = await _run(point, request, call, [(s, by_name[s.name]) for s in ordered],
                          NodeFactsSource(lambda: facts, parents=parents))
    results = tuple(HookResult(s.name, *full.outcomes.get(s.name, ("not called", None)), full.shown.get(s.name))
                    for s in ordered)
    return ChainCheck(point.hook, results, await _credited(point, request, call, ordered, by_name, full),
                      full.refusal, full.sent)


async def _credited(point: HookPoint, request: Message, call: Message | None, ordered: Sequence[HookServerConfig],
                    by_name: Mapping[str, ChainHook], full: _Run) -> tuple[ChainField, ...]:
    """Each field of the call the chain changed, with the last hook that
    changed it: the answers taken applied again, unjudged (as they were
    taken), one more at each run, a field's change found between runs."""
    if full.sent is None:
        return ()
    taken = [(s, by_name[s.name]) for s in ordered if full.outcomes.get(s.name, ("",))[0] == "ok"]
    with _quiet():  # the proxy's lines for the chain were logged by the judged run; once, as the proxy does
        runs = [await _run(point, request, call, taken[:n], None) for n in range(len(taken) + 1)]
    if runs[-1].sent != full.sent:  # cannot be (judging takes or refuses, never changes, an answer): said, not miscredited
        raise RuntimeError(f"the chain's answers taken do not make the call it judged: {runs[-1].sent} != {full.sent}")
    winners: dict[str, ChainField] = {}
    for (server, _), before, after in zip(taken, runs[:-1], runs[1:], strict=True):
        old, new = dict(_flat(before.sent)), dict(_flat(after.sent))
        for name in old.keys() | new.keys():
            if old.get(name) != new.get(name):
                winners[name] = ChainField(name, new.get(name), server.name)
    return tuple(sorted(winners.values(), key=lambda change: change.field))


def _server(point: HookPoint, hook: ChainHook) -> HookServerConfig:
    if hook.answer is not None and not isinstance(hook.answer, point.response_type):
        raise TypeError(f"{hook.name}: a {point.hook.value} answer is a {point.response_type.__name__}, "
                        f"not {type(hook.answer).__name__}")
    return HookServerConfig(hook.name, f"/nonexistent/check-chain/{hook.name}.sock",
                            FailurePolicy(hook.failure_policy), frozenset({point.hook}), priority=hook.priority,
                            answers=Answers(hook.answers))


@dataclass
class _Run:
    sent: Message | None = None
    refusal: str | None = None
    outcomes: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # by file: outcome, cause
    shown: dict[str, Message] = field(default_factory=dict)


class _Registry:
    """The hook files of the chain, fixed (the proxy's registry watches a
    directory): a ``HookSource``."""

    def __init__(self, servers: Sequence[HookServerConfig]) -> None:
        self._snapshot = HookSnapshot({s.name: s for s in servers})

    @property
    def snapshot(self) -> HookSnapshot:
        return self._snapshot

    def servers_for(self, hook: HookType) -> tuple[HookServerConfig, ...]:
        return self._snapshot.servers_for(hook)

    def on_change(self, callback: ChangeCallback) -> None:
        pass  # never changes


class _Answers:
    """The transport (a ``HookTransport``): each endpoint answers its hook's
    answer, and keeps what it was shown."""

    def __init__(self, answers: Mapping[str, tuple[str, bytes]], point: HookPoint, run: _Run) -> None:
        self._answers, self._point, self._run = answers, point, run

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        name, answer = self._answers[endpoint]
        self._run.shown[name] = self._point.request_type.FromString(request)
        return answer

    def keep_only(self, endpoints: Collection[str], grace: float) -> None:
        pass  # no connections

    def endpoints(self) -> frozenset[str]:
        return frozenset()

    async def close(self, grace: float) -> None:
        pass


class _Refused(Exception):
    pass


class _Context:
    """The CRI call's: a Fail hook's refusal aborts it."""

    async def abort(self, code: object, details: str = "") -> None:
        raise _Refused(details)


async def _run(point: HookPoint, request: Message, call: Message | None,
               chain: Sequence[tuple[HookServerConfig, ChainHook]], node: NodeFactsSource | None) -> _Run:
    run = _Run()
    answers = {s.endpoint: (s.name, (h.answer or point.response_type()).SerializeToString()) for s, h in chain}
    metrics = Metrics()  # the proxy's own: each hook's outcome and cause as `runtime-proxy status` has them
    dispatcher = Dispatcher(_Registry([s for s, _ in chain]), metrics, node=node, transport=_Answers(answers, point, run))
    store = StateStore()
    kubelet = _kubelet_call(point, request, call, store)
    stage = HookStage(dispatcher, store)
    sent: list[bytes] = []

    async def send(data: bytes) -> bytes:
        sent.append(data)
        return _REPLIES[point.cri_method].SerializeToString()

    stage_run = stage.stage_for(point.cri_method, "v1", "v1")
    assert stage_run is not None
    try:
        await stage_run(kubelet.SerializeToString(), _Context(), send)
    except _Refused as refused:
        run.refusal = str(refused)
    await stage.drain()
    for name, stats in metrics.hook_stats.items():  # one call each
        (outcome,) = stats.calls
        cause = stats.last_error.get("cause") if stats.last_error else None
        run.outcomes[name] = (outcome, cause if isinstance(cause, str) else None)
    if sent:
        run.sent = type(kubelet).FromString(sent[0])
    return run


_REPLIES: dict[str, Message] = {
    "RunPodSandbox": v1.RunPodSandboxResponse(pod_sandbox_id=POD_ID),
    "CreateContainer": v1.CreateContainerResponse(container_id=CONTAINER_ID),
    "UpdateContainerResources": v1.UpdateContainerResourcesResponse(),
}


def _kubelet_call(point: HookPoint, request: Any, call: Message | None, store: StateStore) -> Message:
    """kubelet's call (given, or built as check_answer builds it), and the
    records the proxy would hold of its pod and container, from ``request``."""
    out: Any = kubelet_call(point, request, call)  # the point's own request type, whose fields are read by point
    if point.hook is HookType.PRE_RUN_POD_SANDBOX:
        if call is None:
            copy_as_wire(out.config.metadata, request.pod_meta)
        return out
    pod = hookapi.PodSandboxHookRequest(cgroup_parent=request.pod_cgroup_parent)
    pod.pod_meta.CopyFrom(request.pod_meta)
    pod.labels.update(request.pod_labels)
    pod.annotations.update(request.pod_annotations)
    pod.resources.CopyFrom(request.pod_resources)
    store.put_pod(POD_ID, pod)
    if point.hook is HookType.PRE_CREATE_CONTAINER:
        out.pod_sandbox_id = POD_ID
        if call is None:
            out.config.metadata.name = request.container_meta.name
            out.config.metadata.attempt = request.container_meta.attempt
        return out
    record = type(request)()
    record.CopyFrom(request)
    container_id = out.container_id or request.container_meta.id or CONTAINER_ID
    record.container_meta.id = out.container_id = container_id
    store.put_container(container_id, POD_ID, record)
    return out


_REPLAYING: ContextVar[bool] = ContextVar("check_chain_replaying", default=False)


class _Replaying(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _REPLAYING.get()


_QUIET_FILTER = _Replaying()


@contextmanager
def _quiet() -> Iterator[None]:
    """The proxy's hook path logs nothing in this context (its tasks too):
    not for other tasks, a proxy in the same process say. A filter on a
    logger sees only its own records, so it goes on each of the path's."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.startswith("runtimeproxy.hookpath"):
            logger.addFilter(_QUIET_FILTER)  # once: addFilter keeps one of each; passes all outside a replay
    token = _REPLAYING.set(True)
    try:
        yield
    finally:
        _REPLAYING.reset(token)


def _flat(message: Message | None, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """A CRI call's set fields, one by one: a map's by key, a repeated field whole."""
    if message is None:
        return
    for descriptor, value in message.ListFields():
        name = f"{prefix}{descriptor.name}"
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            for key, item in value.items():
                yield f"{name}[{key}]", item
        elif descriptor.is_repeated:
            if descriptor.message_type is not None and set(descriptor.message_type.fields_by_name) == {"key", "value"}:
                for entry in value:  # kubelet's envs: by name
                    yield f"{name}[{entry.key}]", entry.value
            else:
                yield name, tuple(value)
        elif descriptor.message_type is not None:
            yield from _flat(value, f"{name}.")
        else:
            yield name, value
