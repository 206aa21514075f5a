"""check_answer: what the proxy would make of a hook's answer, field by
field, in the proxy's own words, for a hook author's unit tests; and that it
judges as the dispatcher does, answer by answer."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from hooks.answercheck import check_answer as direct
from hooks.sdk import HookServer, check_answer
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.executor import HOOKED_METHODS
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.nodefacts import NodeFactsSource
from runtimeproxy.hookpath.parentcpuset import ParentCpusets
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.validate import NodeFacts, parse_id_list
from tests.fakesysfs import CPUSET_MOUNT, cgroup_v1_cpuset
from tests.hookrequests import container_request, pod_request

from ..hookpath.dispatchfakes import Chain, NoConnections

CREATE, UPDATE = HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES
NODE = {"cpus": "0-3", "mems": "0"}
POD = "/kubepods/burstable/pod1"
Resources = hookapi.LinuxContainerResources
Answer = hookapi.ContainerResourceHookResponse


class ExampleHook(HookServer):
    """README's example hook."""

    async def pre_create_container(self, request: hookapi.ContainerResourceHookRequest) -> Answer:
        return Answer(container_resources=Resources(cpu_shares=512), container_envs={"HOOKED_BY": "example"})


def test_the_sdk_exports_it() -> None:
    assert check_answer is direct


async def test_readme_example_answer_is_applied_field_by_field(tmp_path) -> None:  # type: ignore[no-untyped-def]
    request = container_request()
    answer = await ExampleHook(tmp_path / "h.sock").pre_create_container(request)
    check = check_answer("PreCreateContainer", request, answer, **NODE)
    assert check.taken and check.refusal is None
    assert check.outcomes == {"container_resources.cpu_shares": "applied", "container_envs[HOOKED_BY]": "applied"}
    assert check["container_envs[HOOKED_BY]"].reason == "changes the CreateContainer call"


def test_values_the_kernel_refuses_are_refused_in_the_proxys_words_and_the_rest_dropped() -> None:
    answer = Answer(
        container_resources=Resources(cpu_shares=512, cpu_quota=-5, cpuset_cpus="2-5"),
        container_annotations={"a": "b"},
    )
    check = check_answer(CREATE, container_request(), answer, **NODE)
    assert not check.taken
    assert check.outcomes == {
        "container_annotations[a]": "dropped",
        "container_resources.cpu_quota": "refused",
        "container_resources.cpu_shares": "dropped",
        "container_resources.cpuset_cpus": "refused",
    }
    assert check["container_resources.cpu_quota"].reason == "cpu_quota -5 is negative and not -1 (unlimited)"
    assert check["container_resources.cpuset_cpus"].reason == "cpuset_cpus '2-5' names CPUs this node does not have online (4,5)"
    assert check.refusal == (
        "answer carries values the kernel would refuse: cpu_quota -5 is negative and not -1 (unlimited); "
        "cpuset_cpus '2-5' names CPUs this node does not have online (4,5)"
    )


def test_a_key_is_refused_alone_and_a_merged_refusal_names_its_field() -> None:
    keys = Answer(container_resources=Resources(unified={"memory.high": "1", "../evil": "1"}))
    assert check_answer(CREATE, container_request(), keys, **NODE).outcomes == {
        "container_resources.unified[../evil]": "refused", "container_resources.unified[memory.high]": "dropped"}
    request = container_request()  # memory limit 1 GiB
    request.container_resources.memory_swap_limit_in_bytes = 1 << 30
    check = check_answer(CREATE, request, Answer(container_resources=Resources(memory_limit_in_bytes=2 << 30)), **NODE)
    # Not the answer's field, but the one the proxy names: the memory limit it set leaves the swap limit below it.
    assert check.outcomes == {"container_resources.memory_limit_in_bytes": "dropped",
                              "container_resources.memory_swap_limit_in_bytes": "refused"}
    assert check["container_resources.memory_swap_limit_in_bytes"].reason == (
        f"memory_swap_limit_in_bytes {1 << 30} is below memory_limit_in_bytes {2 << 30}, once merged")


def test_a_cpuset_is_judged_by_the_parent_given_and_by_the_one_a_move_goes_to() -> None:
    cgroups = {POD: {"cpuset.cpus": "0-1", "cpuset.mems": "0"}, "/kubepods/wide": {"cpuset.cpus": "0-3"}}
    request = container_request(pod_cgroup_parent=POD)
    pinned = Answer(container_resources=Resources(cpuset_cpus="2-3"))
    check = check_answer(CREATE, request, pinned, **NODE, cgroups=cgroups)
    assert check.outcomes == {"container_resources.cpuset_cpus": "refused"}
    assert check.refusal == ("answer carries values the kernel would refuse: cpuset_cpus '2-3' names CPUs outside "
                             f"the parent cgroup {POD} (2,3; it has 0-1)")
    # A parent not made yet: judged by its nearest ancestor given, as runc copies it.
    moved = Answer(container_resources=Resources(cpuset_cpus="2-3"), pod_cgroup_parent="/kubepods/wide/pod2")
    assert check_answer(CREATE, request, moved, **NODE, cgroups=cgroups).outcomes == {
        "container_resources.cpuset_cpus": "applied", "pod_cgroup_parent": "applied"}
    # No hierarchy given (cgroup v2): no parent judges it.
    assert check_answer(CREATE, request, pinned, **NODE).taken


def test_fields_an_update_has_no_place_for_are_ignored_and_an_echo_changes_nothing() -> None:
    request = container_request(pod_cgroup_parent=POD)  # shown cpu_shares 1024
    answer = Answer(container_resources=Resources(cpu_shares=1024, cpu_quota=50_000),
                    container_envs={"A": "1"}, pod_cgroup_parent="/elsewhere", container_annotations={"c": "d"})
    check = check_answer(UPDATE, request, answer, **NODE)
    ignored = ("hook answer not applied: PreUpdateContainerResources answers' container_envs, pod_cgroup_parent "
               "are not (UpdateContainerResources carries neither env nor a cgroup parent)")
    assert check.taken
    assert [(f.field, f.outcome, f.reason) for f in check.fields] == [
        # kubelet sends no annotations in an update: the proxy adds an echoed one to the call.
        ("container_annotations[c]", "applied", "changes the UpdateContainerResources call"),
        ("container_resources.cpu_quota", "applied", "changes the UpdateContainerResources call"),
        ("container_resources.cpu_shares", "unchanged",
         "the UpdateContainerResources call has it already: an echo changes nothing"),
        ("pod_cgroup_parent", "ignored", ignored),
        ("container_envs[A]", "ignored", ignored),
    ]


def test_an_update_is_judged_against_kubelets_call() -> None:
    """kubelet's update, given: what it names decides what an echo and a whole answer's clear do."""
    request = container_request()
    request.container_resources.MergeFrom(Resources(cpuset_cpus="2-3", cpuset_mems="0"))
    echo = Answer(container_annotations={"c": "d"}, container_resources=Resources(cpu_shares=1024))
    with_annotations = v1.UpdateContainerResourcesRequest(annotations={"c": "d"})
    assert check_answer(UPDATE, request, echo, **NODE, call=with_annotations).outcomes == {
        "container_annotations[c]": "unchanged", "container_resources.cpu_shares": "unchanged"}
    # A whole answer leaving both cpusets empty clears only those kubelet's update names.
    whole = Answer(container_resources=Resources(cpu_shares=1024, memory_limit_in_bytes=1 << 30))
    cpu_manager = v1.UpdateContainerResourcesRequest(linux=v1.LinuxContainerResources(cpuset_cpus="2-3"))
    resize = v1.UpdateContainerResourcesRequest(linux=v1.LinuxContainerResources(cpu_quota=50_000, cpu_period=100_000))
    outcomes = {"container_resources.cpu_shares": "unchanged", "container_resources.memory_limit_in_bytes": "unchanged"}
    assert check_answer(UPDATE, request, whole, **NODE, answers="whole", call=cpu_manager).outcomes == {
        **outcomes, "container_resources.cpuset_cpus": "applied"}
    assert check_answer(UPDATE, request, whole, **NODE, answers="whole", call=resize).outcomes == outcomes
    assert check_answer(UPDATE, request, whole, **NODE, answers="whole").outcomes == outcomes  # the default: a resize
    with pytest.raises(TypeError, match="a PreUpdateContainerResources call is a UpdateContainerResourcesRequest, "
                                        "not CreateContainerRequest"):
        check_answer(UPDATE, request, whole, **NODE, call=v1.CreateContainerRequest())


def test_the_node_is_read_only_where_an_answer_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sys() -> None:
        raise FileNotFoundError("/sys/devices/system/cpu/online")

    monkeypatch.setattr("hooks.checkfacts.read_node_facts", no_sys)
    answer = Answer(container_resources=Resources(cpu_shares=2))
    for hook in (HookType.POST_STOP_CONTAINER, HookType.PRE_START_CONTAINER):
        assert check_answer(hook, container_request(), answer).outcomes == {"container_resources.cpu_shares": "ignored"}
    with pytest.raises(FileNotFoundError):
        check_answer(CREATE, container_request(), answer)


def test_under_nri_what_the_plugin_cannot_apply_is_ignored_in_its_words() -> None:
    pod = check_answer("PreRunPodSandbox", pod_request(), hookapi.PodSandboxHookResponse(
        labels={"app": "nginx", "tier": "web"}, resources=Resources(cpu_shares=512)), **NODE, nri=True)
    assert pod.outcomes == {"labels[app]": "unchanged", "labels[tier]": "ignored", "resources.cpu_shares": "ignored"}
    assert pod["labels[tier]"].reason == "NRI cannot apply this hook answer at this event; dropped"
    request = container_request()
    request.container_resources.MergeFrom(Resources(cpuset_cpus="0-1", cpuset_mems="0"))
    answer = Answer(container_resources=Resources(cpu_shares=2, oom_score_adj=5, memory_swap_limit_in_bytes=4 << 30))
    check = check_answer(CREATE, request, answer, **NODE, answers="whole", nri=True)
    assert check.outcomes == {"container_resources.cpu_shares": "applied", "container_resources.oom_score_adj": "ignored",
                              "container_resources.memory_swap_limit_in_bytes": "ignored",
                              "container_resources.cpuset_cpus": "ignored", "container_resources.cpuset_mems": "ignored"}
    assert check["container_resources.cpuset_cpus"].reason == (
        "whole hook answer clears the container's cpuset; NRI cannot clear one, so it is kept")
    # The CRI proxy applies them all.
    assert set(check_answer(CREATE, request, answer, **NODE, answers="whole").outcomes.values()) == {"applied"}
    # Refused all the same: the NRI plugin judges answers by the proxy's dispatcher.
    assert not check_answer(CREATE, request, Answer(container_resources=Resources(oom_score_adj=5000)), **NODE,
                            nri=True).taken


@pytest.mark.parametrize("hook", [HookType.POST_STOP_CONTAINER, HookType.PRE_START_CONTAINER])
def test_an_answer_where_none_is_applied_is_ignored_whole(hook: HookType) -> None:
    answer = Answer(container_resources=Resources(cpu_quota=-5), container_envs={"A": "1"})
    check = check_answer(hook, container_request(), answer, **NODE)
    why = ("StartContainer carries nothing to change" if hook is HookType.PRE_START_CONTAINER
           else "StopContainer was already answered")
    assert check.taken  # never applied, so never judged
    assert {f.field: (f.outcome, f.reason) for f in check.fields} == {
        "container_resources.cpu_quota": ("ignored", f"hook answer not applied: no {hook.value} answer is ({why})"),
        "container_envs[A]": ("ignored", f"hook answer not applied: no {hook.value} answer is ({why})"),
    }


def test_a_pod_answer() -> None:
    request = pod_request()  # labels app=nginx
    answer = hookapi.PodSandboxHookResponse(labels={"app": "nginx", "tier": "web"}, cgroup_parent="/kubepods/x",
                                            resources=Resources(cpu_shares=512))
    check = check_answer("PreRunPodSandbox", request, answer, **NODE)
    assert check.outcomes == {"labels[app]": "unchanged", "labels[tier]": "applied", "cgroup_parent": "applied",
                              "resources.cpu_shares": "applied"}
    assert check["resources.cpu_shares"].reason == (
        "changes the RunPodSandbox call (the pod's config: containerd passes it on as annotations, to no cgroup)")
    refused = check_answer("PreRunPodSandbox", request, hookapi.PodSandboxHookResponse(resources=Resources(cpu_period=5)),
                           **NODE)
    assert refused.refusal == "answer carries values the kernel would refuse: cpu_period 5 is outside 1000..1000000 µs"


def test_a_whole_answers_empty_cpuset_clears_the_calls() -> None:
    request = container_request()
    request.container_resources.MergeFrom(Resources(cpuset_cpus="0-1", cpuset_mems="0"))
    answer = Answer(container_resources=Resources(cpuset_mems="0", cpu_shares=2))  # cpuset_cpus left empty
    whole = check_answer(CREATE, request, answer, **NODE, answers="whole")
    assert whole.outcomes == {"container_resources.cpu_shares": "applied", "container_resources.cpuset_mems": "unchanged",
                              "container_resources.cpuset_cpus": "applied"}
    assert whole["container_resources.cpuset_cpus"].reason == (
        "whole hook answer asks the runtime to clear the container's cpuset")
    assert "container_resources.cpuset_cpus" not in check_answer(CREATE, request, answer, **NODE).outcomes


def test_no_answer_is_no_change_and_wrong_messages_are_named() -> None:
    assert check_answer(CREATE, container_request(), None, **NODE).fields == ()
    with pytest.raises(TypeError, match="a PreCreateContainer answer is a ContainerResourceHookResponse, not PodSandboxHookResponse"):
        check_answer(CREATE, container_request(), hookapi.PodSandboxHookResponse(), **NODE)
    with pytest.raises(KeyError, match="'pod_cgroup_parent' is not judged: the answer's fields are container_envs"):
        check_answer(CREATE, container_request(), Answer(container_envs={"A": "1"}), **NODE)["pod_cgroup_parent"]
    with pytest.raises(ValueError, match="cpuset.shares"):
        check_answer(CREATE, container_request(), None, **NODE, cgroups={POD: {"cpuset.shares": "1"}})


ANSWERS = {
    "taken": Answer(container_resources=Resources(cpu_shares=512, cpuset_cpus="0-1"), container_envs={"A": "1"}),
    "offline cpus": Answer(container_resources=Resources(cpuset_cpus="3-7")),
    "two refusals": Answer(container_resources=Resources(cpu_period=10, oom_score_adj=5000)),
    "outside its parent": Answer(container_resources=Resources(cpuset_cpus="3")),
    "moved where it fits": Answer(container_resources=Resources(cpuset_cpus="3"), pod_cgroup_parent="/kubepods/wide"),
    "moved where it does not": Answer(container_resources=Resources(cpuset_cpus="1-2"), pod_cgroup_parent="/kubepods/one"),
}


class Answering(NoConnections):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        return self.answer.SerializeToString()


@pytest.mark.parametrize("name", list(ANSWERS))
async def test_it_refuses_what_the_dispatcher_refuses_in_its_words(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same answer through the proxy's dispatcher (a Fail hook, the same
    node and cpuset hierarchy): refused with the same cause, or taken and
    changing the call as the fields check_answer calls applied."""
    answer = ANSWERS[name]
    cgroups = {POD: ("0-1", "0"), "/kubepods/wide": ("0-3", "0"), "/kubepods/one": ("0", "0")}
    cgroup_v1_cpuset(tmp_path, {"/": ("0-3", "0"), **cgroups})
    server = HookServerConfig("h.json", "/run/h.sock", FailurePolicy.FAIL, frozenset({CREATE}))
    node = NodeFactsSource(lambda: NodeFacts(parse_id_list("0-3"), frozenset({0})),
                           parents=ParentCpusets(tmp_path / CPUSET_MOUNT))
    dispatcher = Dispatcher(Chain(server), node=node, transport=Answering(answer))  # type: ignore[arg-type]
    request = container_request(pod_cgroup_parent=POD)
    call = v1.CreateContainerRequest()
    call.sandbox_config.linux.cgroup_parent = POD

    async def build() -> hookapi.ContainerResourceHookRequest:
        return request

    def apply(taken: Answer, _: HookServerConfig) -> bool:
        return HOOKED_METHODS["CreateContainer"].executor.apply(call, taken, request)

    check = check_answer(CREATE, request, answer, **NODE, cgroups={
        path: {"cpuset.cpus": cpus, "cpuset.mems": mems} for path, (cpus, mems) in cgroups.items()})
    try:
        changed = await dispatcher.run_pre(CREATE, build, apply, {})
    except HookError as err:
        assert check.refusal == err.cause
        assert "refused" in check.outcomes.values()
    else:
        assert check.taken
        assert changed == ("applied" in check.outcomes.values())
    assert (name == "taken" or name == "moved where it fits") == check.taken


def test_readmes_example_prints_what_readme_shows(capsys: pytest.CaptureFixture[str]) -> None:
    section = (Path(__file__).parents[3] / "README.md").read_text().split("\n## Writing a hook server\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    example, shown = next((code, text) for (lang, code), (next_lang, text) in pairwise(blocks)
                          if lang == "python" and next_lang == "text" and "print(check_answer(" in code)
    exec(compile(example, "README check_answer example", "exec"), {})
    assert capsys.readouterr().out == shown
