"""Whole answers: a server whose hook file says ``answers: whole`` (a file
named koordlet.json, unless it says otherwise) has its answers' cpusets
taken whole, as koord-runtime-proxy takes them: koordlet clears a BestEffort
container's cpuset_cpus (its cpuset hook answers ""), so the container is
made with no cpuset, and a CPU manager update's cpuset is dropped. Every
other server's empty cpuset keeps the call's, whatever else its answer
carries back: the hook file says which, the answer's content never does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as v1

from ...hookprocs import hook_server, registered
from .crirequests import CREATE, UPDATE, backend_request, create_request

HOOKS = ["PreCreateContainer", "PreUpdateContainerResources"]
# What kubelet's static CPU manager sends for a BestEffort container.
KUBELET = {"cpu_period": 100000, "cpu_shares": 2, "oom_score_adj": 1000, "cpuset_cpus": "0-1", "cpuset_mems": "0"}
# koordlet's answer: the same resources, cpuset_cpus cleared.
KOORDLET = {**KUBELET, "cpuset_cpus": ""}
ANSWERS = {hook: {"container_resources": KOORDLET} for hook in HOOKS}
# kubelet's CPU manager puts the container back on the shared pool.
SHARED_POOL = v1.UpdateContainerResourcesRequest(container_id="ctr-1", linux=v1.LinuxContainerResources(cpuset_cpus="0-3"))


def best_effort_create(**resources: Any) -> v1.CreateContainerRequest:
    request = create_request()
    request.config.linux.resources.CopyFrom(v1.LinuxContainerResources(**{**KUBELET, **resources}))
    return request


async def create_and_update(client: Any, **resources: Any) -> None:
    await client.unary_unary(CREATE)(best_effort_create(**resources).SerializeToString())
    await client.unary_unary(UPDATE)(SHARED_POOL.SerializeToString())


def sent(fake: Any) -> tuple[v1.LinuxContainerResources, v1.LinuxContainerResources]:
    """The resources the runtime was sent: at create, at the update."""
    created = backend_request(fake).config.linux.resources
    return created, v1.UpdateContainerResourcesRequest.FromString(fake.calls(UPDATE)[0].requests[0]).linux


@pytest.mark.parametrize(("file_name", "answers"), [("cpuset", "whole"), ("koordlet.json", None)], ids=["key", "koordlet.json"])
async def test_a_whole_answer_clears_the_cpuset_it_leaves_empty(
    running, fake, client, sock_dir: Path, hook_dir: Path, caplog: pytest.LogCaptureFixture,
    file_name: str, answers: str | None,
) -> None:
    caplog.set_level(logging.DEBUG, "runtimeproxy.hookpath.wholeanswers")
    async with hook_server(sock_dir, "koordlet", ANSWERS) as hook:
        hook.register(hook_dir, HOOKS, answers=answers, name=file_name)
        await registered(running, 1)
        await create_and_update(client)
        assert hook.requests("PreUpdateContainerResources")[0]["container_resources"]["cpuset_cpus"] == "0-3"

    created, updated = sent(fake)
    assert (created.cpuset_cpus, created.cpuset_mems, created.cpu_shares, created.oom_score_adj) == ("", "0", 2, 1000)
    assert updated.cpuset_cpus == ""  # kubelet's dropped: the runtime keeps the container's (none)
    assert running.store.containers["ctr-1"].container_resources.cpuset_cpus == ""
    lines = [r for r in caplog.records if r.name == "runtimeproxy.hookpath.wholeanswers"]
    assert [(r.hook, r.cpuset_fields, r.pod, r.container) for r in lines] == [  # type: ignore[attr-defined]
        ("PreCreateContainer", ["cpuset_cpus"], "default/web", "app"),
        ("PreUpdateContainerResources", ["cpuset_cpus"], "default/web", "app"),
    ]
    # At info once per container and field: kubelet sends a refused update again every 10 s.
    assert [r.levelno for r in lines] == [logging.INFO, logging.DEBUG]
    # Logged before the runtime has the call: what is asked of it.
    assert "asks the runtime to clear the container's cpuset" in lines[0].getMessage()
    assert {r.hook_file for r in lines} == {file_name if file_name.endswith(".json") else f"{file_name}.json"}  # type: ignore[attr-defined]


async def test_a_lean_answer_echoing_kubelets_values_keeps_the_cpusets(running, fake, client, sock_dir: Path, hook_dir: Path) -> None:
    # kubelet's cpu_period and oom_score_adj carried back, the cpuset empty:
    # the shape of a whole answer, from a server whose file does not say so.
    lean = {hook: {"container_resources": {"cpu_period": 100000, "cpu_quota": 50000, "oom_score_adj": 1000}} for hook in HOOKS}
    async with hook_server(sock_dir, "lean", lean) as hook:
        hook.register(hook_dir, HOOKS)
        await registered(running, 1)
        await create_and_update(client)
    created, updated = sent(fake)
    assert (created.cpuset_cpus, created.cpuset_mems, created.cpu_quota) == ("0-1", "0", 50000)
    assert updated.cpuset_cpus == "0-3"  # the shared pool kubelet asked for: a Guaranteed pod's exclusivity holds
    assert running.store.containers["ctr-1"].container_resources.cpuset_cpus == "0-3"


async def test_koordlet_json_saying_changes_keeps_the_cpusets(running, fake, client, sock_dir: Path, hook_dir: Path) -> None:
    async with hook_server(sock_dir, "koordlet", ANSWERS) as hook:
        hook.register(hook_dir, HOOKS, answers="changes", name="koordlet.json")
        await registered(running, 1)
        await create_and_update(client)
    created, updated = sent(fake)
    assert (created.cpuset_cpus, updated.cpuset_cpus) == ("0-1", "0-3")


async def test_in_a_chain_a_whole_answer_after_one_that_set_a_cpuset_clears_it(
    running, fake, client, sock_dir: Path, hook_dir: Path
) -> None:
    # a-pin.json comes before koordlet.json (file name order): its cpuset is
    # what koordlet is shown, and koordlet's whole answer clears it.
    pin = {"PreCreateContainer": {"container_resources": {"cpuset_cpus": "1"}}}
    whole = {"PreCreateContainer": {"container_resources": KOORDLET}}
    async with hook_server(sock_dir, "pin", pin) as first, hook_server(sock_dir, "koordlet", whole) as second:
        first.register(hook_dir, ["PreCreateContainer"], name="a-pin.json")
        second.register(hook_dir, ["PreCreateContainer"], name="koordlet.json")
        await registered(running, 2)
        await client.unary_unary(CREATE)(best_effort_create().SerializeToString())
        assert second.requests()[0]["container_resources"]["cpuset_cpus"] == "1"
    assert backend_request(fake).config.linux.resources.cpuset_cpus == ""


async def test_with_cfs_quota_off_the_hook_file_decides_whole_clears_changes_keeps(
    running, fake, client, sock_dir: Path, hook_dir: Path
) -> None:
    # CFS quota off: kubelet sends no cpu_period. The same answer clears from
    # a whole server (koordlet.json) and keeps from a lean one: the hook file's
    # word, never the answer's content; a zero period is unset for both.
    zero = {"PreCreateContainer": {"container_resources": {**KOORDLET, "cpu_period": 0}}}
    async with hook_server(sock_dir, "koordlet", zero) as whole:
        whole.register(hook_dir, ["PreCreateContainer"], name="koordlet.json")
        await registered(running, 1)
        await client.unary_unary(CREATE)(best_effort_create(cpu_period=0).SerializeToString())
        (hook_dir / "koordlet.json").unlink()
        await registered(running, 0)
    async with hook_server(sock_dir, "lean", zero) as lean:
        lean.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(best_effort_create(cpu_period=0).SerializeToString())
    cleared, kept = (backend_request(fake, index=i).config.linux.resources for i in (0, 1))
    assert (cleared.cpuset_cpus, cleared.cpu_period, cleared.oom_score_adj) == ("", 0, 1000)
    assert (kept.cpuset_cpus, kept.cpu_period) == ("0-1", 0)
