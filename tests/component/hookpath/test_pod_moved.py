"""A pod that a PreRunPodSandbox hook moved to another cgroup parent takes its
containers along: containerd puts a container's cgroup under the parent in
CreateContainer's sandbox_config, which is kubelet's copy of the pod config,
so the proxy carries the moved parent into each CreateContainer."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from cri_api.v1 import api_pb2 as v1

from ...hookprocs import hook_server, registered
from .crirequests import CREATE, POD_STATUS, RUN_POD, backend_request, create_request, sandbox_config

MOVED = "/kubepods/besteffort/moved"
KUBELETS = "/kubepods/burstable/poduid-1"  # sandbox_config()'s
MOVER = {"PreRunPodSandbox": {"cgroup_parent": MOVED}}


async def run_pod(fake, client) -> None:  # type: ignore[no-untyped-def]
    fake.script(RUN_POD, response=v1.RunPodSandboxResponse(pod_sandbox_id="pod-1").SerializeToString())
    await client.unary_unary(RUN_POD)(v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString())
    sent = v1.RunPodSandboxRequest.FromString(fake.calls(RUN_POD)[0].requests[0])
    assert sent.config.linux.cgroup_parent == MOVED


async def test_containers_follow_their_moved_pod(running, fake, client, sock_dir, hook_dir) -> None:
    # Only a PreRunPodSandbox hook: CreateContainer has no hook of its own, and
    # is still read before it goes.
    async with hook_server(sock_dir, "mover", MOVER) as mover:
        mover.register(hook_dir, ["PreRunPodSandbox"])
        await registered(running, 1)
        await run_pod(fake, client)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
    sent = backend_request(fake)
    assert sent.sandbox_config.linux.cgroup_parent == MOVED
    expected = create_request()
    expected.sandbox_config.linux.cgroup_parent = MOVED
    assert sent == expected  # nothing else changed
    assert running.store.containers["ctr-1"].pod_cgroup_parent == MOVED


async def test_container_hooks_see_where_the_container_goes(running, fake, client, sock_dir, hook_dir) -> None:
    async with hook_server(sock_dir, "a-mover", MOVER) as mover, hook_server(sock_dir, "b-seer", {"PreCreateContainer": {}}) as seer:
        mover.register(hook_dir, ["PreRunPodSandbox"])
        seer.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 2)
        await run_pod(fake, client)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert seer.requests("PreCreateContainer")[0]["pod_cgroup_parent"] == MOVED
    assert backend_request(fake).sandbox_config.linux.cgroup_parent == MOVED


async def test_a_container_hook_still_has_the_last_word(running, fake, client, sock_dir, hook_dir) -> None:
    own = {"PreCreateContainer": {"pod_cgroup_parent": "/kubepods/besteffort/own"}}
    async with hook_server(sock_dir, "a-mover", MOVER) as mover, hook_server(sock_dir, "b-own", own) as container_hook:
        mover.register(hook_dir, ["PreRunPodSandbox"])
        container_hook.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 2)
        await run_pod(fake, client)
        await client.unary_unary(CREATE)(create_request().SerializeToString())
    assert backend_request(fake).sandbox_config.linux.cgroup_parent == "/kubepods/besteffort/own"


async def test_a_pod_left_where_it_was_sends_its_containers_as_they_came(
    running, fake, client, sock_dir, hook_dir
) -> None:
    async with hook_server(sock_dir, "watcher", {"PreRunPodSandbox": {}}) as watcher:
        watcher.register(hook_dir, ["PreRunPodSandbox"])
        await registered(running, 1)
        fake.script(RUN_POD, response=v1.RunPodSandboxResponse(pod_sandbox_id="pod-1").SerializeToString())
        await client.unary_unary(RUN_POD)(v1.RunPodSandboxRequest(config=sandbox_config()).SerializeToString())
        raw = noncanonical_create()
        await client.unary_unary(CREATE)(raw)
    assert fake.calls(CREATE)[0].requests == [raw]
    assert running.store.containers["ctr-1"].pod_cgroup_parent == KUBELETS


@pytest.mark.parametrize("mover_left", [True, False], ids=["mover-registered", "mover-gone"])
async def test_a_pod_read_back_after_a_restart_is_carried_too(
    running, fake, client, sock_dir, hook_dir, mover_left: bool
) -> None:
    # The proxy restarted and its rebuild has not reached the pod: the record is
    # read back from the runtime, which keeps the config it was sent (moved),
    # whether or not the server that moved it is still there.
    config = sandbox_config()
    config.linux.cgroup_parent = MOVED
    info = json.dumps({"config": json_format.MessageToDict(config, preserving_proto_field_name=True)})
    fake.script(POD_STATUS, response=v1.PodSandboxStatusResponse(info={"info": info}).SerializeToString())
    async with hook_server(sock_dir, "mover", MOVER) as mover, hook_server(sock_dir, "seer", {"PreCreateContainer": {}}) as seer:
        if mover_left:
            mover.register(hook_dir, ["PreRunPodSandbox"])
        seer.register(hook_dir, ["PreCreateContainer"])
        await registered(running, 2 if mover_left else 1)
        assert "pod-1" not in running.store.pods
        await client.unary_unary(CREATE)(create_request().SerializeToString())
        assert seer.requests("PreCreateContainer")[0]["pod_cgroup_parent"] == MOVED
    assert backend_request(fake).sandbox_config.linux.cgroup_parent == MOVED


async def test_a_pod_whose_mover_is_gone_still_takes_its_containers_on_either_path(
    running, fake, client, sock_dir, hook_dir
) -> None:
    # The mover's file is gone, another server (no pre hook of its own for
    # CreateContainer) stays: the pod is still under the moved parent, and a
    # container (a restarted one, say) left under kubelet's would escape its
    # limits. The same on both data paths, whatever else is in flight.
    async with hook_server(sock_dir, "mover", MOVER) as mover, hook_server(sock_dir, "other", {"PostStartContainer": {}}) as other:
        path = mover.register(hook_dir, ["PreRunPodSandbox"])
        other.register(hook_dir, ["PostStartContainer"])
        await registered(running, 2)
        await run_pod(fake, client)
        path.unlink()
        await registered(running, 1)
        await client.unary_unary(CREATE)(noncanonical_create())
    sent = backend_request(fake)
    expected = create_request()
    expected.sandbox_config.linux.cgroup_parent = MOVED
    assert sent == expected


async def test_with_no_hook_server_left_calls_go_as_they_came(running, fake, client, sock_dir, hook_dir) -> None:
    # Without any hook server the proxy keeps no records and changes nothing,
    # as if it were not there.
    async with hook_server(sock_dir, "mover", MOVER) as mover:
        path = mover.register(hook_dir, ["PreRunPodSandbox"])
        await registered(running, 1)
        await run_pod(fake, client)
        path.unlink()
        await registered(running, 0)
        raw = noncanonical_create()
        await client.unary_unary(CREATE)(raw)
    assert fake.calls(CREATE)[0].requests == [raw]


def noncanonical_create() -> bytes:
    """create_request()'s bytes with its fields in reverse order: a request the
    proxy decoded and encoded again would reach the runtime reordered."""
    request = create_request()
    parts = []
    for field, _ in reversed(request.ListFields()):
        single = v1.CreateContainerRequest()
        single.MergeFrom(request)
        for other, _ in request.ListFields():
            if other is not field:
                single.ClearField(other.name)
        parts.append(single.SerializeToString())
    raw = b"".join(parts)
    assert raw != request.SerializeToString() and v1.CreateContainerRequest.FromString(raw) == request
    return raw
