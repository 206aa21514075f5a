"""check_answer against the proxy itself, field by field: each answer, and
each of its fields alone, through the real HookStage on kubelet's call (the
CRI path) or through the NRI plugin's HookAdapter (``nri=True``), at every
hook point whose answer is applied; kubelet's partial updates included (a
resize, a CPU manager's cpuset)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.nri import api_pb2 as nri
from cri_api.v1 import api_pb2 as v1
from hooks.answercheck import AnswerCheck, Outcome, _items, check_answer
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.hookfile import Answers, FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.merge import CPUSETS
from runtimeproxy.hookpath.nodefacts import NodeFactsSource
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType
from runtimeproxy.hookpath.stage import HookStage
from runtimeproxy.hookpath.store import StateStore, container_record, pod_record
from runtimeproxy.hookpath.validate import NodeFacts, parse_id_list
from runtimeproxy.hookpath.wholeanswers import CLEAR_KEPT
from runtimeproxy.nri.adapter import HookAdapter
from runtimeproxy.nri.limits import NRI_DROPPED, ObservingDispatcher

from ..hookpath.dispatchfakes import Chain, NoConnections

POD, CREATE, UPDATE = HookType.PRE_RUN_POD_SANDBOX, HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES
NODE = {"cpus": "0-3", "mems": "0"}
PARENT = "/kubepods/burstable/poduid-1"
R = hookapi.LinuxContainerResources
A = hookapi.ContainerResourceHookResponse
P = hookapi.PodSandboxHookResponse


def facts() -> NodeFacts:
    return NodeFacts(parse_id_list(NODE["cpus"]), parse_id_list(NODE["mems"]))


class Answering(NoConnections):
    def __init__(self, answer: Message) -> None:
        self.answer, self.shown = answer, []

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        self.shown.append(request)
        return self.answer.SerializeToString()


class Refused(Exception):
    pass


class Context:
    async def abort(self, code: object, details: str = "") -> None:
        raise Refused(details)


def pod_config() -> v1.PodSandboxConfig:
    config = v1.PodSandboxConfig(metadata=v1.PodSandboxMetadata(name="nginx", uid="uid-1", namespace="default"),
                                 labels={"app": "nginx"}, annotations={"anno": "1"})
    config.linux.cgroup_parent = PARENT
    config.linux.resources.cpu_shares = 1024
    return config


def create_call() -> v1.CreateContainerRequest:
    call = v1.CreateContainerRequest(pod_sandbox_id="pod-1", sandbox_config=pod_config())
    call.config.metadata.name = "web"
    call.config.annotations["c"] = "d"
    call.config.envs.add(key="PATH", value=b"/bin")
    call.config.linux.resources.MergeFrom(v1.LinuxContainerResources(
        cpu_shares=1024, cpu_period=100_000, memory_limit_in_bytes=1 << 30, cpuset_cpus="0-1", cpuset_mems="0"))
    return call


def store() -> StateStore:
    """The pod and its container as the proxy recorded them at their creation."""
    out = StateStore()
    pod = pod_record(pod_config())
    out.put_pod("pod-1", pod)
    out.put_container("ctr-1", "pod-1", container_record(pod, create_call().config, "ctr-1"))
    return out


# kubelet's updates: a resize (generateLinuxContainerResources: no cpusets, no
# annotations) and a CPU manager's (cpuset_cpus alone).
RESIZE = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(
    cpu_shares=2048, cpu_period=100_000, cpu_quota=200_000, memory_limit_in_bytes=1 << 30))
CPU_MANAGER = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpuset_cpus="2-3"))


@dataclass
class StageRun:
    shown: Message  # the hook request
    sent: Message | None  # the call as it went to the runtime; None: refused
    cause: str | None  # the refusal's


async def through_stage(hook: HookType, call: Message, answer: Message, answers: Answers = Answers.CHANGES) -> StageRun:
    server = HookServerConfig("h.json", "/nonexistent/h.sock", FailurePolicy.FAIL, frozenset({hook}), answers=answers)
    transport = Answering(answer)
    dispatcher = Dispatcher(Chain(server), node=NodeFactsSource(facts), transport=transport)  # type: ignore[arg-type]
    stage = HookStage(dispatcher, store())
    method = HOOK_POINTS[hook].cri_method
    sent: list[bytes] = []
    reply = {"RunPodSandbox": v1.RunPodSandboxResponse(pod_sandbox_id="pod-2"),
             "CreateContainer": v1.CreateContainerResponse(container_id="ctr-2"),
             "UpdateContainerResources": v1.UpdateContainerResourcesResponse()}[method]

    async def send(data: bytes) -> bytes:
        sent.append(data)
        return reply.SerializeToString()

    run = stage.stage_for(method, "v1", "v1")
    assert run is not None
    shown = HOOK_POINTS[hook].request_type
    try:
        await run(call.SerializeToString(), Context(), send)  # type: ignore[arg-type]
    except Refused as refused:
        return StageRun(shown.FromString(transport.shown[0]), None, str(refused))
    await stage.drain()
    return StageRun(shown.FromString(transport.shown[0]), type(call).FromString(sent[0]), None)


def resources(call: Message) -> v1.LinuxContainerResources | None:
    if isinstance(call, v1.CreateContainerRequest):
        return call.config.linux.resources
    return call.linux if isinstance(call, v1.UpdateContainerResourcesRequest) else None


async def assert_as_the_stage_does(hook: HookType, call: Message, answer: Message, answers: Answers = Answers.CHANGES,
                                   given: bool = True) -> AnswerCheck:
    """check_answer's verdicts are the stage's: the answer refused with the
    same cause, or taken; each field alone changes the call exactly when it is
    ``applied``; a whole answer empties exactly the cpusets called cleared.
    ``given``: kubelet's call given to check_answer (else its default model)."""
    whole = await through_stage(hook, call, answer, answers)
    check = check_answer(hook, whole.shown, answer, call=call if given else None, **NODE, answers=answers.value)
    assert check.refusal == (None if whole.cause is None else whole.cause.split(f"{hook.value}: ", 1)[1].split(
        "; failure-policy Fail")[0])
    if whole.sent is None:
        return check
    for item in _items(HOOK_POINTS[hook], answer):
        alone = await through_stage(hook, call, item.alone)  # each field's own doing, without a whole answer's clears
        assert alone.sent is not None
        changed = alone.sent != call
        assert (check[item.name].outcome is Outcome.APPLIED) == changed, (item.name, check[item.name], alone.sent)
    before, after = resources(call), resources(whole.sent)
    cleared = {f"container_resources.{name}" for name in CPUSETS
               if before is not None and after is not None and getattr(before, name) and not getattr(after, name)}
    called = {c.field for c in check.fields if c.reason.startswith("whole hook answer")}
    assert cleared == {field for field in called if check[field].outcome is Outcome.APPLIED}
    assert (whole.sent != call) == (Outcome.APPLIED in check.outcomes.values())
    return check


ECHO_AND_CHANGES = A(
    container_resources=R(cpu_shares=1024, memory_limit_in_bytes=2 << 30, cpuset_cpus="0-1", cpuset_mems="0",
                          unified={"memory.high": "1"}, hugepage_limits=[hookapi.HugepageLimit(page_size="2MB", limit=1)]),
    container_envs={"PATH": "/bin", "X": "1"}, container_annotations={"c": "d", "e": "f"},
    pod_cgroup_parent=PARENT)


async def test_create_field_by_field() -> None:
    check = await assert_as_the_stage_does(CREATE, create_call(), ECHO_AND_CHANGES)
    assert check.outcomes["container_envs[PATH]"] == "unchanged"
    assert check.outcomes["container_annotations[e]"] == "applied"
    moved = A(pod_cgroup_parent="/kubepods/besteffort/poduid-1", container_resources=R(cpu_quota=50_000))
    await assert_as_the_stage_does(CREATE, create_call(), moved)
    await assert_as_the_stage_does(CREATE, create_call(), moved, given=False)  # the default call: built from the request


async def test_create_whole_answers_and_refusals() -> None:
    check = await assert_as_the_stage_does(CREATE, create_call(), A(container_resources=R(cpu_shares=2)), Answers.WHOLE)
    assert check.outcomes == {"container_resources.cpu_shares": "applied", "container_resources.cpuset_cpus": "applied",
                              "container_resources.cpuset_mems": "applied"}
    refused = A(container_resources=R(cpu_quota=-5, cpu_shares=2))
    check = await assert_as_the_stage_does(CREATE, create_call(), refused, Answers.WHOLE)
    assert check.outcomes == {"container_resources.cpu_quota": "refused", "container_resources.cpu_shares": "dropped",
                              "container_resources.cpuset_cpus": "dropped", "container_resources.cpuset_mems": "dropped"}


async def test_pod_field_by_field() -> None:
    answer = P(labels={"app": "nginx", "tier": "web"}, annotations={"anno": "1"}, cgroup_parent="/kubepods/x",
               resources=R(cpu_shares=1024, cpuset_cpus="0"))
    check = await assert_as_the_stage_does(POD, v1.RunPodSandboxRequest(config=pod_config()), answer)
    assert check.outcomes == {"labels[app]": "unchanged", "labels[tier]": "applied", "annotations[anno]": "unchanged",
                              "cgroup_parent": "applied", "resources.cpu_shares": "unchanged",
                              "resources.cpuset_cpus": "applied"}
    await assert_as_the_stage_does(POD, v1.RunPodSandboxRequest(config=pod_config()), answer, given=False)


@pytest.mark.parametrize("given", [True, False], ids=["call given", "default call"])
async def test_a_resize_update_field_by_field(given: bool) -> None:
    """The default call is a resize: what a hook is shown of one is judged as the stage does."""
    answer = A(container_resources=R(cpu_shares=2048, cpu_quota=100_000, cpuset_cpus="2-3", cpuset_mems="0"),
               container_annotations={"c": "d"}, container_envs={"A": "1"})
    check = await assert_as_the_stage_does(UPDATE, RESIZE, answer, given=given)
    # kubelet sends no annotations: an echoed one is added to the call.
    assert check.outcomes["container_annotations[c]"] == "applied"
    assert check.outcomes["container_resources.cpu_shares"] == "unchanged"
    # A whole answer's cleared cpusets: none, as a resize names none.
    whole = A(container_resources=R(cpu_shares=1024, memory_limit_in_bytes=1 << 30, cpu_quota=200_000, cpu_period=100_000))
    check = await assert_as_the_stage_does(UPDATE, RESIZE, whole, Answers.WHOLE, given=given)
    assert check.outcomes == {"container_resources.cpu_period": "unchanged", "container_resources.cpu_quota": "unchanged",
                              "container_resources.cpu_shares": "applied",
                              "container_resources.memory_limit_in_bytes": "unchanged"}


async def test_a_cpu_managers_update_field_by_field() -> None:
    """cpuset_cpus alone: a whole answer clears it, not cpuset_mems, which the update does not name."""
    echo = A(container_annotations={"c": "d"}, container_resources=R(cpu_shares=1024, cpuset_cpus="2-3"))
    check = await assert_as_the_stage_does(UPDATE, CPU_MANAGER, echo)
    assert check.outcomes == {"container_annotations[c]": "applied", "container_resources.cpu_shares": "unchanged",
                              "container_resources.cpuset_cpus": "unchanged"}
    mems_only = A(container_resources=R(cpu_shares=1024, memory_limit_in_bytes=1 << 30, cpuset_mems="0"))
    check = await assert_as_the_stage_does(UPDATE, CPU_MANAGER, mems_only, Answers.WHOLE)
    assert check.outcomes["container_resources.cpuset_cpus"] == "applied"
    cpus_only = A(container_resources=R(cpu_shares=1024, memory_limit_in_bytes=1 << 30, cpuset_cpus="2-3"))
    check = await assert_as_the_stage_does(UPDATE, CPU_MANAGER, cpus_only, Answers.WHOLE)
    assert "container_resources.cpuset_mems" not in check.outcomes
    assert Outcome.APPLIED not in check.outcomes.values()
    await assert_as_the_stage_does(UPDATE, CPU_MANAGER, A(container_resources=R(cpuset_cpus="5")))  # refused


# -- under NRI: the plugin's own adapter, dispatcher and stage ----------------

def nri_pod() -> nri.PodSandbox:
    return nri.PodSandbox(id="pod-1", name="nginx", uid="uid-1", namespace="default", labels={"app": "nginx"},
                          annotations={"anno": "1"}, linux=nri.LinuxPodSandbox(cgroup_parent=PARENT))


def nri_container() -> nri.Container:
    return nri.Container(
        id="ctr-1", pod_sandbox_id="pod-1", name="web", env=["PATH=/bin"], annotations={"c": "d"},
        linux=nri.LinuxContainer(
            cgroups_path=f"{PARENT}/ctr-1", oom_score_adj=nri.OptionalInt(value=-997),
            resources=nri.LinuxResources(
                cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=1024), cpus="0-1", mems="0"),
                memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30)))))


NRI_UPDATE = nri.LinuxResources(cpu=nri.LinuxCPU(shares=nri.OptionalUInt64(value=2048), cpus="0-1", mems="0"),
                                memory=nri.LinuxMemory(limit=nri.OptionalInt64(value=1 << 30)))


async def through_nri(hook: HookType, answer: Message, answers: Answers = Answers.CHANGES) -> tuple[Message, bool]:
    """The hook request shown, and whether the runtime was asked for a change (the adjustment or update)."""
    server = HookServerConfig("h.json", "/nonexistent/h.sock", FailurePolicy.FAIL, frozenset({hook}), answers=answers)
    transport = Answering(answer)
    dispatcher = ObservingDispatcher(Chain(server), node=NodeFactsSource(facts))
    dispatcher.transport = transport  # type: ignore[assignment]
    state = StateStore()
    adapter = HookAdapter(HookStage(dispatcher, state, carries=False), state, budget=5.0)
    pod, container = nri_pod(), nri_container()
    await adapter.synchronize([pod], [container] if hook is UPDATE else [])
    changed = False
    if hook is POD:
        await adapter.state_change(nri.StateChangeEvent(event=nri.Event.RUN_POD_SANDBOX, pod=pod))
    elif hook is CREATE:
        adjustment = await adapter.create_container(pod, container)
        changed = adjustment != nri.ContainerAdjustment()
    else:
        changed = bool(await adapter.update_container(pod, container, NRI_UPDATE))
    await adapter.close()
    return HOOK_POINTS[hook].request_type.FromString(transport.shown[0]), changed


NRI_ANSWERS = {
    POD: P(labels={"app": "nginx", "tier": "web"}, cgroup_parent="/kubepods/x", resources=R(cpu_shares=512)),
    CREATE: A(container_resources=R(cpu_shares=512, oom_score_adj=100, memory_swap_limit_in_bytes=4 << 30,
                                    cpuset_cpus="0-1"),
              container_annotations={"c": "d", "e": "f"}, container_envs={"X": "1"}, pod_cgroup_parent=PARENT),
    UPDATE: A(container_resources=R(cpu_shares=512, oom_score_adj=100, cpu_quota=50_000),
              container_annotations={"c": "d", "e": "f"}),
}


@pytest.mark.parametrize("hook", list(NRI_ANSWERS), ids=lambda hook: hook.value)
async def test_under_nri_field_by_field(hook: HookType, caplog: pytest.LogCaptureFixture) -> None:
    """Each field alone through the NRI plugin: ``ignored`` exactly when the
    plugin logs it dropped, ``applied`` exactly when it asks the runtime for
    a change it applies."""
    answer = NRI_ANSWERS[hook]
    shown, _ = await through_nri(hook, HOOK_POINTS[hook].response_type())
    check = check_answer(hook, shown, answer, **NODE, nri=True)
    assert check.taken
    for item in _items(HOOK_POINTS[hook], answer):
        caplog.clear()
        _, changed = await through_nri(hook, item.alone)
        dropped = any(record.getMessage().startswith(NRI_DROPPED) for record in caplog.records)
        verdict = check[item.name]
        assert (verdict.outcome is Outcome.IGNORED) == dropped, item.name
        assert (verdict.outcome is Outcome.APPLIED) == (changed and not dropped), item.name
        assert verdict.reason == NRI_DROPPED if dropped else verdict.reason != NRI_DROPPED
    cri = check_answer(hook, shown, answer, **NODE)
    assert {field for field, outcome in check.outcomes.items() if outcome != cri.outcomes[field]}  # what NRI changes


async def test_under_nri_a_whole_answers_clear_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    answer = A(container_resources=R(cpu_shares=512))
    shown, _ = await through_nri(CREATE, HOOK_POINTS[CREATE].response_type())
    caplog.clear()
    await through_nri(CREATE, answer, Answers.WHOLE)
    kept = [record for record in caplog.records if record.getMessage() == CLEAR_KEPT]
    check = check_answer(CREATE, shown, answer, **NODE, answers="whole", nri=True)
    assert check.outcomes == {"container_resources.cpu_shares": "applied", "container_resources.cpuset_cpus": "ignored",
                              "container_resources.cpuset_mems": "ignored"}
    assert {f"container_resources.{name}" for name in kept[0].cpuset_fields} == {  # type: ignore[attr-defined]
        c.field for c in check.fields if c.reason == CLEAR_KEPT}
    assert logging.INFO == kept[0].levelno
