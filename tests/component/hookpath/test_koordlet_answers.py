"""Answers shaped as koordlet's: the request's resources sent back with its
changes. koordlet clears a BestEffort container's cpuset_cpus (its cpuset
hook answers ""), and koord-runtime-proxy takes an answer's cpusets whole:
the container is made with no cpuset, and a CPU manager update's cpuset is
dropped. A lean answer (only its changes) leaves the cpusets as they were."""

from __future__ import annotations

from cri_api.v1 import api_pb2 as v1

from ...hookprocs import hook_server, registered
from .crirequests import CREATE, UPDATE, backend_request, create_request

# What kubelet's static CPU manager sends for a BestEffort container.
KUBELET = {"cpu_period": 100000, "cpu_shares": 2, "oom_score_adj": 1000, "cpuset_cpus": "0-1", "cpuset_mems": "0"}
# koordlet's answer: the same resources, cpuset_cpus cleared.
KOORDLET = {**KUBELET, "cpuset_cpus": ""}


def best_effort_create() -> v1.CreateContainerRequest:
    request = create_request()
    request.config.linux.resources.CopyFrom(v1.LinuxContainerResources(**KUBELET))
    return request


async def test_a_koordlet_answer_clears_the_cpuset_it_empties(running, fake, client, sock_dir, hook_dir) -> None:
    answers = {
        "PreCreateContainer": {"container_resources": KOORDLET},
        "PreUpdateContainerResources": {"container_resources": {**KOORDLET, "cpuset_cpus": ""}},
    }
    async with hook_server(sock_dir, "koordlet", answers) as hook:
        hook.register(hook_dir, ["PreCreateContainer", "PreUpdateContainerResources"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(best_effort_create().SerializeToString())
        # kubelet's CPU manager puts the container back on the shared pool.
        update = v1.UpdateContainerResourcesRequest(
            container_id="ctr-1", linux=v1.LinuxContainerResources(cpuset_cpus="0-1")
        )
        await client.unary_unary(UPDATE)(update.SerializeToString())
        assert hook.requests("PreUpdateContainerResources")[0]["container_resources"]["cpuset_cpus"] == "0-1"

    created = backend_request(fake).config.linux.resources
    assert (created.cpuset_cpus, created.cpuset_mems, created.cpu_shares, created.oom_score_adj) == ("", "0", 2, 1000)
    updated = v1.UpdateContainerResourcesRequest.FromString(fake.calls(UPDATE)[0].requests[0])
    assert updated.linux.cpuset_cpus == ""  # the runtime keeps the container's (none)
    assert running.store.containers["ctr-1"].container_resources.cpuset_cpus == ""


async def test_a_lean_answer_keeps_the_cpusets(running, fake, client, sock_dir, hook_dir) -> None:
    lean = {"PreCreateContainer": {"container_resources": {"cpu_shares": 512}}}
    async with hook_server(sock_dir, "lean", lean) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(best_effort_create().SerializeToString())
    created = backend_request(fake).config.linux.resources
    assert (created.cpuset_cpus, created.cpuset_mems, created.cpu_shares) == ("0-1", "0", 512)


async def test_an_answer_that_changed_a_marker_is_not_read_whole(running, fake, client, sock_dir, hook_dir) -> None:
    # A hook setting the OOM score is not echoing: its empty cpuset is unset.
    answers = {"PreCreateContainer": {"container_resources": {**KOORDLET, "oom_score_adj": 999}}}
    async with hook_server(sock_dir, "oom", answers) as hook:
        hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 1)
        await client.unary_unary(CREATE)(best_effort_create().SerializeToString())
    created = backend_request(fake).config.linux.resources
    assert (created.cpuset_cpus, created.oom_score_adj) == ("0-1", 999)
