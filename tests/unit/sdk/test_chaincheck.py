"""check_chain: what the proxy would make of several hooks' answers at one
hook point, by its own stage (hooks/chaincheck.py). Before: check_answer
judged one answer, and a chain (which hook's value wins, a refusal that a
later hook's move lifts) could be seen only behind a running proxy."""

from __future__ import annotations

import logging
import re
from itertools import pairwise
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from hooks import chaincheck
from hooks.answercheck import check_answer
from hooks.sdk import ChainHook, check_chain
from runtimeproxy.hookclient.transport import HookTransport
from runtimeproxy.hookpath.registry import HookSource
from tests.hookrequests import container_request, pod_request

NODE = {"cpus": "0-3", "mems": "0"}
POD = "/kubepods/burstable/pod1"
CREATE, UPDATE = "PreCreateContainer", "PreUpdateContainerResources"
R = hookapi.LinuxContainerResources
A = hookapi.ContainerResourceHookResponse


async def test_the_later_hook_by_priority_then_file_name_wins_a_field_and_sees_the_earlier_s_change() -> None:
    chain = [
        ChainHook("b.json", A(container_resources=R(cpu_shares=256), container_envs={"B": "1"})),
        ("a.json", A(container_resources=R(cpu_shares=512, cpu_quota=50_000))),
        ChainHook("z.json", A(container_resources=R(cpu_shares=512)), priority=-1),  # before both
    ]
    check = await check_chain(CREATE, container_request(), chain, **NODE)
    assert [h.name for h in check.hooks] == ["z.json", "a.json", "b.json"]
    assert {h.outcome for h in check.hooks} == {"ok"} and check.refusal is None
    assert check.winners == {
        "config.linux.resources.cpu_shares": "b.json",
        "config.linux.resources.cpu_quota": "a.json",  # a's echo of z's 512 changed nothing: z's shares, b's now
        "config.envs[B]": "b.json",
    }
    assert check.sent.config.linux.resources.cpu_shares == 256
    shown = {h.name: h.shown.container_resources.cpu_shares for h in check.hooks}
    assert shown == {"z.json": 1024, "a.json": 512, "b.json": 512}  # each sees the call as the hooks before left it
    assert str(check).splitlines()[:2] == ["PreCreateContainer chain: call goes on", "  z.json: ok"]


async def test_a_refused_answer_is_dropped_under_ignore_and_refuses_the_call_under_fail() -> None:
    bad = A(container_resources=R(cpu_quota=-5, cpu_shares=2))
    good = A(container_resources=R(cpu_shares=512))
    ignored = await check_chain(CREATE, container_request(), [("a.json", bad), ("b.json", good)], **NODE)
    assert [(h.name, h.outcome) for h in ignored.hooks] == [("a.json", "invalid_value"), ("b.json", "ok")]
    assert "cpu_quota -5 is negative" in str(ignored.hooks[0].cause)
    assert ignored.refusal is None and ignored.winners == {"config.linux.resources.cpu_shares": "b.json"}

    failed = await check_chain(CREATE, container_request(), [ChainHook("a.json", bad, "Fail"), ("b.json", good)], **NODE)
    assert [(h.name, h.outcome) for h in failed.hooks] == [("a.json", "invalid_value"), ("b.json", "not called")]
    assert failed.sent is None and failed.fields == ()
    assert failed.refusal is not None and "hook server a.json" in failed.refusal and "cpu_quota -5" in failed.refusal


async def test_a_cpuset_outside_its_parent_is_taken_when_a_later_hook_moves_the_pod_to_a_parent_that_fits() -> None:
    cgroups = {POD: {"cpuset.cpus": "0-1", "cpuset.mems": "0"}, "/kubepods/wide": {"cpuset.cpus": "0-3"}}
    request = container_request(pod_cgroup_parent=POD)
    pinned = ChainHook("a.json", A(container_resources=R(cpuset_cpus="2-3")), "Fail")
    assert not check_answer(CREATE, request, pinned.answer, **NODE, cgroups=cgroups).taken  # alone: refused
    mover = ChainHook("b.json", A(pod_cgroup_parent="/kubepods/wide/pod1"), "Fail")
    check = await check_chain(CREATE, request, [pinned, mover], **NODE, cgroups=cgroups)
    assert check.refusal is None and [h.outcome for h in check.hooks] == ["ok", "ok"]
    assert check.winners == {"config.linux.resources.cpuset_cpus": "a.json",
                             "sandbox_config.linux.cgroup_parent": "b.json"}
    stays = await check_chain(CREATE, request, [pinned, ChainHook("b.json", A(), "Fail")], **NODE, cgroups=cgroups)
    assert stays.sent is None and "outside the parent cgroup" in str(stays.refusal)


async def test_an_update_chain_and_a_whole_answer_s_clear() -> None:
    cpu_manager = v1.UpdateContainerResourcesRequest(container_id="cid-1",
                                                     linux=v1.LinuxContainerResources(cpuset_cpus="2-3"))
    check = await check_chain(UPDATE, container_request(), [
        ("a.json", A(container_resources=R(cpu_quota=20_000))),
        ChainHook("b.json", A(container_resources=R(cpu_quota=30_000, cpu_shares=100)), answers="whole"),
    ], call=cpu_manager, **NODE)
    assert check.winners == {"linux.cpu_quota": "b.json", "linux.cpu_shares": "b.json",
                             "linux.cpuset_cpus": "b.json"}  # b's whole answer has none: kubelet's cleared
    assert [(c.field, c.value) for c in check.fields if c.field == "linux.cpuset_cpus"] == [("linux.cpuset_cpus", None)]
    assert check.sent.container_id == "cid-1" and check.sent.linux.cpuset_cpus == ""


async def test_a_field_set_back_to_kubelets_value_is_listed_with_the_hook_that_did() -> None:
    check = await check_chain(CREATE, container_request(), [  # kubelet's shares: 1024
        ("a.json", A(container_resources=R(cpu_shares=512))), ("b.json", A(container_resources=R(cpu_shares=1024)))],
        **NODE)
    assert check.winners == {"config.linux.resources.cpu_shares": "b.json"}
    assert check.sent.config.linux.resources.cpu_shares == 1024


async def test_the_proxys_log_once_lines_are_logged_once_for_the_chain(caplog: pytest.LogCaptureFixture) -> None:
    """Crediting replays the answers taken, once per hook: before, each
    replay's new dispatcher logged its lines again (7 of these, not 2)."""
    caplog.set_level(logging.INFO)
    with_env = A(container_resources=R(cpu_shares=100), container_envs={"X": "1"})  # no env on an update
    await check_chain(UPDATE, container_request(), [("a.json", with_env), ("b.json", A(container_resources=R(
        cpu_quota=1000))), ("c.json", with_env)], **NODE)
    noted = [r for r in caplog.records if r.getMessage().startswith("hook answer not applied")]
    assert len(noted) == 2, [r.getMessage() for r in noted]


async def test_a_replays_silence_is_its_own_context_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    quiet = logging.getLogger("runtimeproxy.hookpath.dispatch")
    with chaincheck._quiet():
        quiet.warning("muted")
    quiet.warning("heard")
    assert [r.getMessage() for r in caplog.records] == ["heard"]


def test_the_stand_ins_are_what_the_dispatcher_takes() -> None:
    """A member the dispatcher comes to need is one of these protocols': a
    stand-in without it fails here, not as a no-op in a check."""
    assert isinstance(chaincheck._Registry([]), HookSource)
    assert isinstance(chaincheck._Answers({}, chaincheck.HOOK_POINTS[chaincheck.HookType(CREATE)],
                                          chaincheck._Run()), HookTransport)


async def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not applied"):
        await check_chain("PostStartContainer", container_request(), [("a.json", A())])
    with pytest.raises(TypeError, match="a.json: a PreCreateContainer answer is a ContainerResourceHookResponse"):
        await check_chain(CREATE, container_request(), [("a.json", hookapi.PodSandboxHookResponse())], **NODE)
    with pytest.raises(ValueError, match="its own name"):
        await check_chain(CREATE, container_request(), [("a.json", A()), ("a.json", A())], **NODE)
    with pytest.raises(TypeError, match="request"):
        await check_chain(CREATE, pod_request(), [("a.json", A())], **NODE)


def test_readmes_example_prints_what_readme_shows(capsys: pytest.CaptureFixture[str]) -> None:
    section = (Path(__file__).parents[3] / "README.md").read_text().split("\n## Writing a hook server\n", 1)[1]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section.split("\n## ", 1)[0], re.MULTILINE | re.DOTALL)
    example, shown = next((code, text) for (lang, code), (next_lang, text) in pairwise(blocks)
                          if lang == "python" and next_lang == "text" and "check_chain(" in code)
    exec(compile(example, "README check_chain example", "exec"), {})
    assert capsys.readouterr().out == shown
