"""balloons and batchresource on one node, each run by ``hook run`` with no
--priority, through the proxy in front of containerd 1.6 + runc: both hooks'
values land in a BE container's cgroups, and balloons sizes its balloon by
the batch-cpu request, so kubelet's updates change neither."""

from __future__ import annotations

import json

import yaml

from runtimeproxy.host.crispec import container_config

from ..hookprocs import registered
from .batchhelpers import batchresource_hook
from .crihelpers import V1
from .test_balloons import balloons_hook, cpuset_of, rebuilt
from .test_batchresource import BE, batch, container_values, pod, spec
from .test_hooks_real import container_pid

MIB = 2**20


async def test_a_be_container_gets_its_balloon_and_its_batch_values(launcher, cri_channel, pod_log_dir, tmp_path) -> None:
    config_path = tmp_path / "balloons.yaml"
    config_path.write_text(yaml.safe_dump({
        "reservedResources": {"cpu": "cpuset:0"},
        "runtimeEndpoint": str(launcher.socket),
        "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxBalloons": 1}],
    }))
    running, _ = await launcher.start()
    async with (
        launcher.channel() as channel,
        balloons_hook(launcher, config_path) as balloons,
        batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms"),
    ):
        await registered(running, 2)
        await rebuilt(balloons)
        assert json.loads((launcher.hook_dir / "balloons.json").read_text())["priority"] == 100
        async with pod(channel, cri_channel, pod_log_dir, BE, spec(main=batch("1000", "128Mi"))) as p:
            rt, pb = V1.runtime(channel), V1.pb
            config = container_config(pb, name="main", resources=pb.LinuxContainerResources(cpu_shares=2))  # kubelet's for BE
            create = pb.CreateContainerRequest(pod_sandbox_id=p.id, config=config, sandbox_config=p.config)
            cid = (await rt.CreateContainer(create, timeout=60)).container_id
            await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
            pid = await container_pid(V1, channel, cid)
            assert await cpuset_of(channel, cid) == "1"
            assert container_values(pid) == (1024, 100000, 128 * MIB)
            # balloons saw batchresource's shares: the container counts with its batch-cpu request.
            (work,) = [b for b in json.loads(await balloons.status("--json"))["balloons"] if b["name"] == "work[0]"]
            assert [c["milli_cpus"] for c in work["containers"]] == [1000]
            # kubelet's CPU manager puts it back on its shared pool: both hooks' values stay.
            update = pb.UpdateContainerResourcesRequest(container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus="0-1"))
            await rt.UpdateContainerResources(update, timeout=60)
            assert await cpuset_of(channel, cid) == "1"
            assert container_values(pid) == (1024, 100000, 128 * MIB)
