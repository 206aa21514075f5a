"""A PreCreateContainer chain is judged by the parent cgroup's cpuset as it
leaves the call (chaincpuset.py): a cpuset a later hook's move makes fit is
taken, and a move that takes an earlier hook's cpuset outside its new parent
is that move's failure, by its failure policy (a fake tree stands for this
node's sysfs and cpuset hierarchy)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import grpc

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookclient.transport import CallFailed
from runtimeproxy.hookpath.chaincpuset import ChainCpusets
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.hookfile import Answers, FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.merge import clear_cpusets, emptied_cpusets, merge_resources
from tests.fakesysfs import set_cgroup_cpuset, set_nodes_with_memory

from .dispatchfakes import Chain
from .test_parent_judged import CREATE, NARROW, POD, ByEndpoint, Node

FAIL, IGNORE = FailurePolicy.FAIL, FailurePolicy.IGNORE
ISO = "/kubepods/isolated"  # CPUs 2-3; the pod's parent has 0-1, NARROW 0


def pin(cpus: str) -> hookapi.ContainerResourceHookResponse:
    return hookapi.ContainerResourceHookResponse(container_resources=hookapi.LinuxContainerResources(cpuset_cpus=cpus))


def move(parent: str) -> hookapi.ContainerResourceHookResponse:
    return hookapi.ContainerResourceHookResponse(pod_cgroup_parent=parent)


NOTHING = hookapi.ContainerResourceHookResponse()
# A whole answer clearing the cpusets: its resources present, and empty (as
# koordlet sends a BestEffort container's).
EMPTIED = hookapi.ContainerResourceHookResponse(container_resources=hookapi.LinuxContainerResources())


class Awaiting(ByEndpoint):
    """Each endpoint of ``first`` awaits its coroutine before it answers."""

    def __init__(self, answers: dict[str, hookapi.ContainerResourceHookResponse],
                 first: dict[str, Callable[[], Awaitable[None]]]) -> None:
        super().__init__(answers)
        self.first = first

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        if endpoint in self.first:
            await self.first[endpoint]()
        return await super().call(endpoint, method, request, timeout, owner_uid)


class Run:
    """Hooks answering in chain order (name, policy, answer) on a container of
    the pod's parent (kubelet's cpuset 0-1); ``request`` as the chain leaves it."""

    def __init__(
        self, tmp_path: Path, *hooks: tuple[str, FailurePolicy, hookapi.ContainerResourceHookResponse],
        first: dict[str, Callable[[], Awaitable[None]]] | None = None, whole: frozenset[str] = frozenset(),
    ) -> None:
        self.log_fields: dict[str, object] = {"container": "app"}  # the call's
        self.node = Node(tmp_path)
        set_cgroup_cpuset(self.node.root, ISO, "2-3", "0")
        servers = [  # whole: hooks whose answers are read whole (their empty cpusets clear the call's)
            HookServerConfig(f"{n}.json", f"/run/{n}.sock", p, frozenset({CREATE}), timeout=1.0,
                             answers=Answers.WHOLE if n in whole else Answers.CHANGES)
            for n, p, _ in hooks
        ]
        transport = Awaiting(
            {f"/run/{n}.sock": answer for n, _, answer in hooks},
            {f"/run/{n}.sock": wait for n, wait in (first or {}).items()},
        )
        self.dispatcher = Dispatcher(
            Chain(*servers), self.node.metrics, node=self.node.source, transport=transport  # type: ignore[arg-type]
        )
        self.request = hookapi.ContainerResourceHookRequest(
            pod_cgroup_parent=POD, container_resources=hookapi.LinuxContainerResources(cpuset_cpus="0-1")
        )

    async def run(self) -> tuple[str, str]:
        async def build() -> hookapi.ContainerResourceHookRequest:
            return hookapi.ContainerResourceHookRequest.FromString(self.request.SerializeToString())

        def apply(answer: hookapi.ContainerResourceHookResponse, server: HookServerConfig) -> bool:
            # As CreateContainer.apply with the stage's WholeAnswers.
            self.request.pod_cgroup_parent = answer.pod_cgroup_parent or self.request.pod_cgroup_parent
            if answer.HasField("container_resources"):
                resources = self.request.container_resources
                clear = emptied_cpusets(resources, answer.container_resources) if server.answers is Answers.WHOLE else ()
                merge_resources(resources, answer.container_resources)
                clear_cpusets(resources, clear)
            return True

        await self.dispatcher.run_pre(CREATE, build, apply, self.log_fields)
        return self.request.pod_cgroup_parent, self.request.container_resources.cpuset_cpus

    def counted(self, name: str, outcome: str) -> float:
        labels = {"server": f"{name}.json", "hook": CREATE.value, "outcome": outcome}
        return self.node.metrics.registry.get_sample_value("runtime_proxy_hook_calls_total", labels) or 0.0


async def test_a_cpuset_a_later_move_makes_fit_is_taken(tmp_path: Path) -> None:
    """b pins to CPUs 2-3, outside the pod's parent; a then moves the container
    to ISO, which has them: the call the chain leaves is one the kernel takes
    (b was refused, judged by the parent it had)."""
    run = Run(tmp_path, ("b", FAIL, pin("2-3")), ("a", FAIL, move(ISO)))
    assert await run.run() == (ISO, "2-3")
    assert (run.counted("b", "ok"), run.counted("b", "invalid_value")) == (1, 0)
    # b's parent; ISO for the cpuset a's move takes along; ISO again at the chain's end, for b
    assert run.node.parents.reads == 3


async def test_a_move_taking_an_earlier_cpuset_outside_its_parent_fails_under_fail(tmp_path: Path) -> None:
    """b pins to CPU 1, within the pod's parent; a moves the container to ISO,
    which lacks it: a's answer completed the pair, and is named, with b
    (runc failed the container, EACCES, naming neither)."""
    run = Run(tmp_path, ("b", FAIL, pin("1")), ("a", FAIL, move(ISO)))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "a.json"
    assert refused.value.cause == (
        f"answer carries values the kernel would refuse: cpuset_cpus '1' names CPUs outside the parent cgroup {ISO} "
        "(1; it has 2-3), set by b.json earlier in the chain and taken along by this answer's move"
    )
    assert (run.counted("a", "invalid_value"), run.counted("b", "ok")) == (1, 1)


async def test_a_last_move_taking_an_earlier_cpuset_outside_its_parent_is_dropped_under_ignore(tmp_path: Path) -> None:
    run = Run(tmp_path, ("b", FAIL, pin("1")), ("a", IGNORE, move(ISO)))
    assert await run.run() == (POD, "1")  # b's pin stays, under the parent it fits
    assert run.counted("a", "invalid_value") == 1


async def test_an_ignore_move_with_hooks_after_it_is_not_judged_for_the_cpusets_it_takes_along(tmp_path: Path) -> None:
    """b's move takes b's CPU 0 outside ISO, but c then pins the container to
    CPU 2, which ISO has: the call goes on as the chain left it (b's move was
    dropped for a cpuset c set again, and c judged by the pod's parent)."""
    run = Run(tmp_path, ("a", FAIL, pin("0")), ("b", IGNORE, move(ISO)), ("c", FAIL, pin("2")))
    assert await run.run() == (ISO, "2")
    assert (run.counted("b", "ok"), run.counted("c", "ok")) == (1, 1)


async def test_a_move_refused_is_taken_when_a_later_hook_sets_a_cpuset_that_fits(tmp_path: Path) -> None:
    run = Run(tmp_path, ("b", FAIL, pin("1")), ("a", FAIL, move(ISO)), ("c", FAIL, pin("3")))
    assert await run.run() == (ISO, "3")
    assert (run.counted("a", "ok"), run.counted("a", "invalid_value")) == (1, 0)


async def test_a_pair_outside_both_parents_is_blamed_on_the_later_hook(tmp_path: Path) -> None:
    """b's CPU 3 is outside the pod's parent, and a moves it to NARROW (CPU 0):
    refused at the chain's end, after c, naming a, whose move completed the
    pair; b's call is counted refused too."""
    run = Run(tmp_path, ("b", FAIL, pin("3")), ("a", FAIL, move(NARROW)), ("c", FAIL, hookapi.ContainerResourceHookResponse()))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "a.json"
    assert refused.value.cause.endswith(f"outside the parent cgroup {NARROW} (3; it has 0), set by b.json earlier "
                                        "in the chain and taken along by this answer's move")
    assert (run.counted("a", "invalid_value"), run.counted("b", "invalid_value"), run.counted("c", "ok")) == (1, 1, 1)


async def test_a_deferred_refusal_stands_when_a_later_hook_fails(tmp_path: Path) -> None:
    """The chain cut short by c's refusal: b's answer, still outside, is counted refused."""
    run = Run(tmp_path, ("b", FAIL, pin("3")), ("c", FAIL, pin("7")))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "c.json"
    assert run.counted("b", "invalid_value") == 1


async def test_a_deferred_refusal_a_later_hook_sets_again_within_the_parent_is_cleared(tmp_path: Path) -> None:
    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, pin("1")))
    assert await run.run() == (POD, "1")
    assert (run.counted("a", "ok"), run.counted("a", "invalid_value")) == (1, 0)


async def test_a_deferred_cpuset_mems_a_later_move_makes_fit_is_taken(tmp_path: Path) -> None:
    run = Run(tmp_path, ("a", FAIL, hookapi.ContainerResourceHookResponse(
        container_resources=hookapi.LinuxContainerResources(cpuset_mems="1"))), ("b", FAIL, move(ISO)), ("c", FAIL, NOTHING))
    (run.node.root / "sys/devices/system/node").mkdir()
    (run.node.root / "sys/devices/system/node/online").write_text("0-1\n")
    set_nodes_with_memory(run.node.root, "0-1\n")
    set_cgroup_cpuset(run.node.root, ISO, "2-3", "0-1")  # the pod's parent has node 0
    assert await run.run() == (ISO, "0-1")
    assert run.request.container_resources.cpuset_mems == "1"
    assert run.counted("a", "ok") == 1


async def test_a_parent_widened_during_the_chain_is_read_at_its_end(tmp_path: Path) -> None:
    """a's CPU 2 is outside the pod's parent as a answers; the parent is
    widened to it while b answers: the chain's end reads it again."""
    async def widen() -> None:
        set_cgroup_cpuset(run.node.root, POD, "0-3", "0")

    run = Run(tmp_path, ("a", FAIL, pin("2")), ("b", FAIL, NOTHING), first={"b": widen})
    assert await run.run() == (POD, "2")
    assert run.counted("a", "ok") == 1


async def test_a_deferred_answer_is_counted_cancelled_when_the_call_is(tmp_path: Path) -> None:
    """Cancelled once b is called, a's answer deferred (before: cancelled
    every 10 ms, which a late loop could land in a's call)."""
    b_called = asyncio.Event()

    async def hang() -> None:
        b_called.set()
        await asyncio.Event().wait()

    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, NOTHING), first={"b": hang})
    chain = asyncio.ensure_future(run.run())
    await asyncio.wait_for(b_called.wait(), 5)
    chain.cancel()
    with pytest.raises(asyncio.CancelledError):
        await chain
    assert (run.counted("a", "cancelled"), run.counted("a", "invalid_value"), run.counted("b", "cancelled")) == (1, 0, 1)


async def test_a_deferred_refusal_stands_when_a_later_hook_times_out(tmp_path: Path) -> None:
    async def hang() -> None:
        await asyncio.sleep(0.01)
        raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "")

    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, NOTHING), first={"b": hang})
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "b.json"
    assert (run.counted("a", "invalid_value"), run.counted("b", "deadline_exceeded")) == (1, 1)


async def test_an_error_judging_the_chains_end_refuses_the_call_naming_the_last_deferred_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("cannot read")

    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, pin("2")), ("c", FAIL, NOTHING))
    monkeypatch.setattr(run.node.source, "outside", broken)
    with caplog.at_level(logging.DEBUG, "runtimeproxy.hookpath.dispatch"), pytest.raises(HookError) as refused:
        await run.run()
    assert (refused.value.server.name, refused.value.cause) == ("b.json", "RuntimeError: cannot read")
    assert (run.counted("a", "error"), run.counted("b", "error"), run.counted("c", "ok")) == (1, 1, 1)
    assert run.dispatcher._outages.down("b.json")  # the refused call counts in b's outage
    traced = [r for r in caplog.records if r.exc_info]
    assert [(r.getMessage(), r.container) for r in traced] == [("unexpected error judging the chain's cpusets", "app")]


async def test_an_error_keeping_the_chains_cpusets_refuses_the_call_naming_that_answers_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside the hook call's own handling (its answer is applied): refused
    as the chain's end would be, not an error escaping the chain."""
    def broken(*args: object) -> None:
        raise RuntimeError("lost")

    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", IGNORE, NOTHING), ("c", FAIL, NOTHING))
    monkeypatch.setattr(ChainCpusets, "taken", lambda self, server, *rest: broken() if server.name == "b.json" else None)
    with pytest.raises(HookError) as refused:
        await run.run()
    assert (refused.value.server.name, refused.value.cause) == ("b.json", "RuntimeError: lost")
    assert (run.counted("a", "error"), run.counted("b", "ok"), run.counted("c", "ok")) == (1, 1, 0)


async def test_an_ignore_answer_is_judged_as_it_comes(tmp_path: Path) -> None:
    """Not deferred: dropping it once later hooks saw it would undo what they
    answered on (chaincpuset.py), so a later move that would make it fit comes too late."""
    run = Run(tmp_path, ("b", IGNORE, pin("2-3")), ("a", FAIL, move(ISO)))
    assert await run.run() == (ISO, "0-1")
    assert run.counted("b", "invalid_value") == 1


async def test_a_deferred_cpuset_a_later_whole_answer_clears_is_not_judged(tmp_path: Path) -> None:
    """b pins CPUs 2-3, outside the pod's parent; koordlet, whose answers are
    whole, then clears the cpuset: the call leaves the chain without one, so
    b's refusal no longer stands (it named b for a cpuset the runtime never got)."""
    run = Run(tmp_path, ("b", FAIL, pin("2-3")), ("koordlet", IGNORE, EMPTIED), whole=frozenset({"koordlet"}))
    assert await run.run() == (POD, "")
    assert run.counted("b", "ok") == 1
    assert run.counted("b", "invalid_value") == 0


async def test_a_cpuset_set_after_a_whole_answer_cleared_one_is_judged(tmp_path: Path) -> None:
    """The clear forgets only what came before it: a later pin outside the
    parent is that hook's refusal."""
    run = Run(tmp_path, ("b", FAIL, pin("2-3")), ("koordlet", IGNORE, EMPTIED), ("c", FAIL, pin("3")),
              whole=frozenset({"koordlet"}))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "c.json"


async def test_a_whole_answer_that_moves_the_container_and_clears_its_cpuset_takes_none_along(tmp_path: Path) -> None:
    """b pins CPU 1; koordlet's whole answer moves the container to ISO and
    clears the cpuset: nothing of b's goes to ISO, so the move is not refused for it."""
    moves_and_clears = hookapi.ContainerResourceHookResponse(
        pod_cgroup_parent=ISO, container_resources=hookapi.LinuxContainerResources())
    run = Run(tmp_path, ("b", FAIL, pin("1")), ("koordlet", FAIL, moves_and_clears), whole=frozenset({"koordlet"}))
    assert await run.run() == (ISO, "")
    assert run.counted("koordlet", "ok") == 1


async def test_a_whole_answer_without_resources_clears_nothing_and_its_move_takes_the_cpusets_along(
    tmp_path: Path,
) -> None:
    """b pins CPU 1; koordlet's whole answer only moves the container to ISO
    (2-3), with no container_resources: it clears nothing (the executor, as
    koord-runtime-proxy, takes resources only from an answer that has them),
    so b's pin goes to ISO with it, and the move is refused naming both (it
    left as (ISO, "1"), and runc failed it, EACCES, naming neither)."""
    run = Run(tmp_path, ("b", FAIL, pin("1")), ("koordlet", FAIL, move(ISO)), whole=frozenset({"koordlet"}))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "koordlet.json"
    assert "set by b.json earlier in the chain and taken along by this answer's move" in refused.value.cause
    assert run.counted("koordlet", "invalid_value") == 1


async def test_a_deferred_answer_is_judged_only_for_a_cpuset_still_its_own(tmp_path: Path) -> None:
    """a's CPUs 0-3 wait for the chain's end; b sets CPU 3, also outside the
    pod's parent: b is refused, for its own value, and a's call counted ok
    (it was counted refused, and could be named, for b's '3')."""
    run = Run(tmp_path, ("a", FAIL, pin("0-3")), ("b", FAIL, pin("3")), ("c", FAIL, NOTHING))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "b.json"
    assert "cpuset_cpus '3'" in refused.value.cause
    assert (run.counted("a", "ok"), run.counted("a", "invalid_value"), run.counted("b", "invalid_value")) == (1, 0, 1)


async def test_a_deferred_answer_whose_cpuset_a_later_hook_set_is_not_named_for_it(tmp_path: Path) -> None:
    """a's CPU 2 waits; b sets CPU 1, within the pod's parent; c's Ignore move
    to ISO, with d after it, takes b's CPU along unjudged (docs/hook-files.md): a is not
    refused for b's '1', the call goes on as the chain left it."""
    run = Run(tmp_path, ("a", FAIL, pin("2")), ("b", FAIL, pin("1")), ("c", IGNORE, move(ISO)), ("d", FAIL, NOTHING))
    assert await run.run() == (ISO, "1")
    assert (run.counted("a", "ok"), run.counted("a", "invalid_value")) == (1, 0)


async def test_a_deferred_move_a_later_move_took_elsewhere_is_not_judged_by_that_parent(tmp_path: Path) -> None:
    """b's move takes a's CPU 1 to ISO, which lacks it; c moves the container
    on to NARROW (CPU 0): c's answer completed that pair, not b's, which is
    not named for a parent it never moved to, and counted ok."""
    run = Run(tmp_path, ("a", FAIL, pin("1")), ("b", FAIL, move(ISO)), ("c", FAIL, move(NARROW)), ("d", FAIL, NOTHING))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "c.json"
    assert refused.value.cause.endswith(f"outside the parent cgroup {NARROW} (1; it has 0), set by a.json earlier "
                                        "in the chain and taken along by this answer's move")
    assert (run.counted("b", "ok"), run.counted("c", "invalid_value")) == (1, 1)


async def test_a_deferred_move_an_ignore_move_took_elsewhere_is_not_named_for_its_parent(tmp_path: Path) -> None:
    """As above with c under Ignore, d after it: c's move is not judged for
    what it takes along (docs/hook-files.md), and b, whose parent is no longer the
    call's, is not named for NARROW: the call goes on as the chain left it."""
    run = Run(tmp_path, ("a", FAIL, pin("1")), ("b", FAIL, move(ISO)), ("c", IGNORE, move(NARROW)), ("d", FAIL, NOTHING))
    assert await run.run() == (NARROW, "1")
    assert run.counted("b", "ok") == 1


async def test_an_ignore_move_with_its_own_cpuset_outside_its_parent_is_dropped_whole(tmp_path: Path) -> None:
    """b moves the container to ISO with CPU 0, which ISO lacks: dropped whole,
    though c sets CPU 3 (all applied, ISO and 3, would fit): c is judged by
    the pod's parent, and refused (docs/hook-files.md: the pair b answered is refused by itself)."""
    b = hookapi.ContainerResourceHookResponse(
        pod_cgroup_parent=ISO, container_resources=hookapi.LinuxContainerResources(cpuset_cpus="0"))
    run = Run(tmp_path, ("a", FAIL, pin("1")), ("b", IGNORE, b), ("c", FAIL, pin("3")))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "c.json"
    assert refused.value.cause.endswith(f"cpuset_cpus '3' names CPUs outside the parent cgroup {POD} (3; it has 0-1)")
    assert run.counted("b", "invalid_value") == 1


async def test_a_deferred_answers_last_error_names_its_cause(tmp_path: Path) -> None:
    """`status` names why a deferred answer was counted as it was, as for any other call."""
    run = Run(tmp_path, ("b", FAIL, pin("3")), ("c", FAIL, pin("7")))
    with pytest.raises(HookError):
        await run.run()
    last = run.node.metrics.hook_stats["b.json"].last_error
    assert last is not None and last["outcome"] == "invalid_value"
    assert last["cause"] == "its cpuset_cpus outside the parent cgroup's, as the chain left the call"


async def test_a_deferred_answer_that_stands_names_its_cpus_in_its_last_error(tmp_path: Path) -> None:
    """b's answer stands at the chain's end and fails the call: its last error said only
    "its cpuset_cpus outside the parent cgroup's", the CPUs in the refusal's reasons alone."""
    run = Run(tmp_path, ("b", FAIL, pin("3")), ("c", FAIL, NOTHING))
    with pytest.raises(HookError) as refused:
        await run.run()
    assert refused.value.server.name == "b.json"
    last = run.node.metrics.hook_stats["b.json"].last_error
    assert last is not None and last["outcome"] == "invalid_value"
    assert last["cause"] == refused.value.cause
    assert last["cause"].endswith(f"cpuset_cpus '3' names CPUs outside the parent cgroup {POD} (3; it has 0-1)")
    assert run.counted("b", "invalid_value") == 1
    assert run.dispatcher._outages.down("b.json")  # a refused call counts in its outage, as any Fail hook's


async def test_a_deferred_answer_cancelled_with_its_cri_call_is_no_failure_of_its_server(tmp_path: Path) -> None:
    """Counted cancelled, never judged: it made a's last error, and a run of one failed call."""
    reached = asyncio.Event()

    async def hang() -> None:
        reached.set()  # a's answer is taken, deferred: b is called
        await asyncio.Event().wait()

    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, NOTHING), first={"b": hang})
    chain = asyncio.ensure_future(run.run())
    await reached.wait()
    chain.cancel()  # kubelet gives up on the CRI call
    with pytest.raises(asyncio.CancelledError):
        await chain
    stats = run.node.metrics.hook_stats
    assert stats["a.json"].calls == {"cancelled": 1} and stats["a.json"].last_error is None
    assert stats["b.json"].calls == {"cancelled": 1} and stats["b.json"].last_error is None


async def test_a_deferred_answer_is_counted_cancelled_when_the_outage_gate_ends_the_chain(tmp_path: Path) -> None:
    """The runtime is lost while a answers: the gate's refusal before b's build
    (grpc's context.abort) ends the call, and a's deferred answer, never
    judged, is counted cancelled (before: invalid_value, as if refused)."""
    run = Run(tmp_path, ("a", FAIL, pin("3")), ("b", FAIL, NOTHING))
    builds = 0

    async def build() -> hookapi.ContainerResourceHookRequest:
        nonlocal builds
        builds += 1
        if builds == 2:  # as RuntimeGate.enter between pre hooks
            raise grpc.aio.AbortError()
        return hookapi.ContainerResourceHookRequest.FromString(run.request.SerializeToString())

    with pytest.raises(grpc.aio.AbortError):
        await run.dispatcher.run_pre(CREATE, build, lambda answer, server: True, run.log_fields)
    assert (run.counted("a", "cancelled"), run.counted("a", "invalid_value"), run.counted("b", "cancelled")) == (1, 0, 0)
    assert run.node.metrics.hook_stats["a.json"].last_error is None
