"""A whole answer's empty cpuset under NRI: containerd ignores an
adjustment's or update's empty cpus, so nothing can clear a cpuset. The
container keeps kubelet's, the records say so (not ""), and the clear that
did not happen is logged once for the container."""

from __future__ import annotations

import logging

from cri_api.nri import api_pb2 as nri

from ...hookprocs import hook_server
from .conftest import container, pod

CLEAR = {"container_resources": {"cpu_shares": 2, "cpuset_cpus": "", "cpuset_mems": "0"}}
HOOKS = ["PreCreateContainer", "PreUpdateContainerResources"]


def pinned() -> nri.Container:
    ctr = container()
    ctr.linux.resources.cpu.cpus, ctr.linux.resources.cpu.mems = "0-1", "0"
    return ctr


async def test_a_whole_answer_cannot_clear_a_cpuset_under_nri(connect, sock_dir, hook_dir, caplog) -> None:
    caplog.set_level(logging.INFO, "runtimeproxy.hookpath.wholeanswers")
    async with hook_server(sock_dir, "koordlet", {hook: CLEAR for hook in HOOKS}) as hook:
        hook.register(hook_dir, HOOKS, name="koordlet.json")  # whole, by its name
        plugin, link = await connect([pod()])
        created = await link.create_container(pod(), pinned())
        await plugin.adapter.idle()
        assert plugin.store.containers["ctr-1"].container_resources.cpuset_cpus == "0-1"  # what containerd keeps
        wanted = nri.LinuxResources(cpu=nri.LinuxCPU(cpus="1"))
        updated = await link.call(
            "UpdateContainer",
            nri.UpdateContainerRequest(pod=pod(), container=pinned(), linux_resources=wanted),
            nri.UpdateContainerResponse,
        )
        await plugin.adapter.idle()
    cpu = created.adjust.linux.resources.cpu
    assert (cpu.cpus, cpu.shares.value) == ("", 2)  # no adjustment of the cpuset, the shares applied
    assert [u.linux.resources.cpu.cpus for u in updated.update] == []  # kubelet's update as it came
    assert plugin.store.containers["ctr-1"].container_resources.cpuset_cpus == "1"  # kubelet's update, kept
    lines = [r for r in caplog.records if r.name == "runtimeproxy.hookpath.wholeanswers"]
    assert len(lines) == 1 and "NRI cannot clear" in lines[0].getMessage()
    assert (lines[0].hook, lines[0].cpuset_fields, lines[0].container) == (  # type: ignore[attr-defined]
        "PreCreateContainer", ["cpuset_cpus"], "app"
    )
