"""The state store: records read back from the runtime, and never resurrected."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

import grpc
import pytest

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.runtimespec import cgroup_parent_from_spec, resources_from_spec
from runtimeproxy.hookpath.store import StateStore


def pod_status(pod_id: str) -> bytes:
    config = {"metadata": {"name": "web", "uid": "u1", "namespace": "ns"}, "labels": {"app": "web"},
              "linux": {"cgroup_parent": "/kubepods/pod-u1"}}
    info = {"config": config, "runtimeHandler": "runc"}
    return v1.PodSandboxStatusResponse(status=v1.PodSandboxStatus(id=pod_id), info={"info": json.dumps(info)}).SerializeToString()


def container_status(container_id: str, pod_id: str, parent: str = "/kubepods/pod-u1") -> bytes:
    config = {"metadata": {"name": "app", "attempt": 2}, "envs": [{"key": "A", "value": "1"}],
              "linux": {"resources": {"cpu_shares": 512, "memory_limit_in_bytes": 1024}}}
    spec = {"process": {"oomScoreAdj": 5},
            "linux": {"cgroupsPath": f"{parent}/{container_id}",
                      "resources": {"cpu": {"shares": 512, "quota": 40000, "period": 100000, "cpus": "0-1"},
                                    "memory": {"limit": 2048, "swap": 2048}}}}
    info = {"sandboxID": pod_id, "config": config, "runtimeSpec": spec}
    return v1.ContainerStatusResponse(info={"info": json.dumps(info)}).SerializeToString()


class Backend:
    def __init__(self, parent: str = "/kubepods/pod-u1") -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.calls: list[str] = []
        self.called = asyncio.Event()  # set on each call (asked() waits on it)
        self.parent = parent  # where the runtime put the container

    async def __call__(self, method: str, request: bytes) -> bytes:
        self.calls.append(method)
        self.called.set()
        await self.gate.wait()
        if method == "PodSandboxStatus":
            return pod_status(v1.PodSandboxStatusRequest.FromString(request).pod_sandbox_id)
        if method == "ContainerStatus":
            return container_status(v1.ContainerStatusRequest.FromString(request).container_id, "p1", self.parent)
        if method == "ListPodSandbox":
            return v1.ListPodSandboxResponse(items=[v1.PodSandbox(id="p1")]).SerializeToString()
        return v1.ListContainersResponse(containers=[v1.Container(id="c1")]).SerializeToString()

    async def asked(self, method: str) -> None:
        """Until ``method`` has been called: the caller's read is under way once it asked."""
        async with asyncio.timeout(5):
            while method not in self.calls:
                self.called.clear()  # (no await since the check: no call came in between)
                await self.called.wait()


async def read_held(kind: str, object_id: str) -> tuple[Backend, StateStore, asyncio.Future[Any]]:
    """A store reading ``kind`` ("pod" or "container") from a backend that holds its answer."""
    backend = Backend()
    backend.gate.clear()
    store = StateStore(read_backend=backend)
    reading = asyncio.ensure_future(getattr(store, kind)(object_id))
    method = "PodSandboxStatus" if kind == "pod" else "ContainerStatus"
    await backend.asked(method)
    return backend, store, reading


async def test_rebuild_reads_config_and_current_resources() -> None:
    store = StateStore(read_backend=Backend())
    await store.rebuild()
    pod = store.pods["p1"]
    assert (pod.pod_meta.uid, pod.labels["app"], pod.cgroup_parent, pod.runtime_handler) == ("u1", "web", "/kubepods/pod-u1", "runc")
    c = store.containers["c1"]
    assert (c.container_meta.name, c.container_meta.attempt, c.container_meta.id) == ("app", 2, "c1")
    assert dict(c.container_envs) == {"A": "1"}
    assert c.pod_labels["app"] == "web" and c.pod_cgroup_parent == "/kubepods/pod-u1"
    # What UpdateContainerResources made of the config, from the runtime spec.
    r = c.container_resources
    assert (r.cpu_shares, r.cpu_quota, r.cpu_period, r.cpuset_cpus) == (512, 40000, 100000, "0-1")
    assert (r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes, r.oom_score_adj) == (2048, 2048, 5)
    assert store.container_pod["c1"] == "p1"


async def test_a_rebuilt_container_is_under_the_cgroup_parent_the_runtime_put_it() -> None:
    """A PreCreateContainer hook moved it (pod_cgroup_parent): the runtime's spec says where."""
    store = StateStore(read_backend=Backend(parent="/kubepods/besteffort/pod-u1"))
    await store.rebuild()
    assert store.pods["p1"].cgroup_parent == "/kubepods/pod-u1"  # the pod's own stays
    assert store.containers["c1"].pod_cgroup_parent == "/kubepods/besteffort/pod-u1"


@pytest.mark.parametrize(("path", "pod_parent", "expected"), [
    ("/kubepods/pod1/c1", "/kubepods/pod1", "/kubepods/pod1"),
    ("/kubepods/besteffort/pod1/c1", "/kubepods/pod1", "/kubepods/besteffort/pod1"),
    ("/kubepods/pod1/c1", "/kubepods/pod1/", "/kubepods/pod1/"),  # the same parent, as kubelet wrote it
    ("kubepods-pod1.slice:cri-containerd:c1", "kubepods-pod1.slice", "kubepods-pod1.slice"),
    ("kubepods-pod1.slice:cri-containerd:c1", "/kubepods.slice/kubepods-pod1.slice", "/kubepods.slice/kubepods-pod1.slice"),
    ("kubepods-besteffort-pod1.slice:cri-containerd:c1", "kubepods-pod1.slice", "kubepods-besteffort-pod1.slice"),
    ("/elsewhere/other-name", "/kubepods/pod1", "/kubepods/pod1"),  # not the runtime's form: not read
    ("", "/kubepods/pod1", "/kubepods/pod1"),
    ("/k8s.io/c1", "", ""),  # no parent from kubelet: containerd's default, kept out of the record
])
def test_cgroup_parent_from_spec(path: str, pod_parent: str, expected: str) -> None:
    assert cgroup_parent_from_spec({"linux": {"cgroupsPath": path}}, "c1", pod_parent) == expected


def test_cgroup_parent_from_a_malformed_spec_is_the_pods() -> None:
    for spec in (None, {}, {"linux": None}, {"linux": {"cgroupsPath": 7}}):
        assert cgroup_parent_from_spec(spec, "c1", "/kubepods/pod1") == "/kubepods/pod1"


async def test_a_read_finishing_after_removal_does_not_resurrect() -> None:
    backend, store, reading = await read_held("pod", "p1")
    store.drop_pod("p1")  # RemovePodSandbox completed meanwhile
    backend.gate.set()
    assert await reading is None
    assert store.pods == {} and store._reading == {} and store._stale_reads == set()
    assert await store.pod("p1") is not None  # a later read is honoured


async def test_forgetting_everything_drops_the_records_and_the_reads_under_way() -> None:
    """A hook server came after calls went by unrecorded: what the store held,
    and what it was reading back then, may be out of date."""
    backend, store, reading = await read_held("pod", "p1")
    store.put_pod("p2", hookapi.PodSandboxHookRequest())
    store.put_container("c2", "p2", hookapi.ContainerResourceHookRequest())
    store.forget_all()
    assert (store.pods, store.containers, store.container_pod) == ({}, {}, {})
    backend.gate.set()
    assert await reading is None and store.pods == {}  # the older read is not kept
    assert await store.pod("p1") is not None  # a read after it is


async def test_a_rebuild_under_way_when_everything_is_forgotten_reads_no_more() -> None:
    backend = Backend()
    pod_read = asyncio.Event()

    async def pod_held(method: str, request: bytes) -> bytes:
        if method == "PodSandboxStatus" and not pod_read.is_set():  # the first read only
            backend.gate.clear()
            pod_read.set()
        return await backend(method, request)

    store = StateStore(read_backend=pod_held)
    rebuilding = asyncio.ensure_future(store.rebuild())
    await pod_read.wait()  # listed, and reading the pod
    store.forget_all()
    backend.gate.set()
    await asyncio.wait_for(rebuilding, 5)
    assert "ContainerStatus" not in backend.calls  # the container was not read after it
    assert (store.pods, store.containers) == ({}, {})


async def test_a_read_older_than_a_write_does_not_overwrite_it() -> None:
    """Start-up rebuild reads a pod while RunPodSandbox's own record lands: the call's record wins."""
    backend, store, reading = await read_held("pod", "p1")
    ours = hookapi.PodSandboxHookRequest(labels={"written": "by-call"})
    store.put_pod("p1", ours)
    backend.gate.set()
    assert await reading is ours
    assert store.pods["p1"] is ours


async def test_a_read_older_than_an_update_is_read_again() -> None:
    """UpdateContainerResources completes while the container is being read: the old read is
    dropped, and the next access reads the runtime again (which then has the update)."""
    backend, store, reading = await read_held("container", "c1")
    store.changed("c1")  # what UpdateContainerResources records for an unknown container
    backend.gate.set()
    assert await reading is None
    assert "c1" not in store.containers
    assert backend.calls.count("ContainerStatus") == 1
    assert await store.container("c1") is not None
    assert backend.calls.count("ContainerStatus") == 2


async def test_garbled_answers_mean_no_record() -> None:
    async def garbage(method: str, request: bytes) -> bytes:
        return b"\xff\xff\xff"

    store = StateStore(read_backend=garbage)
    assert await store.container("c1") is None
    assert await store.pod("p1") is None
    assert store.pods == {} and store.containers == {}


def test_resources_from_spec_ignores_what_is_unset_or_malformed() -> None:
    assert resources_from_spec(None) == resources_from_spec({})
    out = resources_from_spec({"linux": {"resources": {"cpu": {"quota": -1, "cpus": 7}, "memory": {"limit": "x"}}}})
    assert (out.cpu_quota, out.cpuset_cpus, out.memory_limit_in_bytes) == (0, "", 0)


def _with_bad_utf8_name(item: v1.PodSandbox) -> bytes:
    """A list item whose metadata name is not UTF-8: containerd accepts it, Python's protobuf does not."""
    raw = item.SerializeToString()
    assert b"BADNAME" in raw
    return raw.replace(b"BADNAME", b"BAD\xffAME")


async def test_rebuild_skips_an_unreadable_pod_and_keeps_the_others(caplog: Any) -> None:
    """One sandbox with non-UTF-8 metadata costs only itself, not every pod's record."""

    class OneBadPod(Backend):
        async def __call__(self, method: str, request: bytes) -> bytes:
            if method == "ListPodSandbox":
                good = v1.PodSandbox(id="p1").SerializeToString()
                bad = _with_bad_utf8_name(v1.PodSandbox(id="bad", metadata=v1.PodSandboxMetadata(name="BADNAME")))
                # repeated field 1 of ListPodSandboxResponse, one item after the other
                return b"".join(b"\x0a" + bytes([len(item)]) + item for item in (bad, good))
            if method == "PodSandboxStatus" and v1.PodSandboxStatusRequest.FromString(request).pod_sandbox_id == "bad":
                return _with_bad_utf8_name(
                    v1.PodSandboxStatusResponse(status=v1.PodSandboxStatus(id="bad", metadata=v1.PodSandboxMetadata(name="BADNAME")))
                )
            return await super().__call__(method, request)

    store = StateStore(read_backend=OneBadPod())
    with caplog.at_level("WARNING", logger="runtimeproxy.hookpath.store"):
        await store.rebuild()
    assert set(store.pods) == {"p1"}
    assert set(store.containers) == {"c1"} and store.container_pod["c1"] == "p1"
    assert any(getattr(r, "id", None) == "bad" for r in caplog.records)


async def test_rebuild_of_readable_lists_warns_about_nothing(caplog: Any) -> None:
    """Containers are read as containers: a real sandbox id in field 2 is no reason to warn."""
    sandbox_id = "5f2a" * 16  # parsed as PodSandboxMetadata it would not decode

    class RealIds(Backend):
        async def __call__(self, method: str, request: bytes) -> bytes:
            if method == "ListContainers":
                return v1.ListContainersResponse(
                    containers=[v1.Container(id="c1", pod_sandbox_id=sandbox_id)]
                ).SerializeToString()
            return await super().__call__(method, request)

    store = StateStore(read_backend=RealIds())
    with caplog.at_level("WARNING", logger="runtimeproxy.hookpath.store"):
        await store.rebuild()
    assert set(store.containers) == {"c1"}
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []


async def _with_a_write_while_listing(store: StateStore, backend: Backend, listing: Coroutine[Any, Any, None]) -> None:
    """Run ``listing`` (a rebuild, a resync) with RunPodSandbox's record of "new-pod" landing while it lists."""
    backend.gate.clear()
    task = asyncio.ensure_future(listing)
    await backend.asked("ListPodSandbox")  # the listing is under way
    store.put_pod("new-pod", hookapi.PodSandboxHookRequest())  # RunPodSandbox answered meanwhile
    backend.gate.set()
    await task


async def test_rebuild_forgets_what_the_backend_no_longer_has_but_not_what_a_call_wrote_meanwhile() -> None:
    """A removal whose answer was lost when the runtime died leaves a record the
    runtime no longer lists: the rebuild after the restart drops it. A record a
    call writes while the rebuild lists is newer than the listing and stays."""
    backend = Backend()  # lists p1 and c1 only
    store = StateStore(read_backend=backend)
    store.put_pod("gone-pod", hookapi.PodSandboxHookRequest())
    store.put_container("gone-ctr", "gone-pod", hookapi.ContainerResourceHookRequest())
    await _with_a_write_while_listing(store, backend, store.rebuild())
    assert set(store.pods) == {"p1", "new-pod"}
    assert set(store.containers) == {"c1"} and "gone-ctr" not in store.container_pod
    assert store._listings == []


class _Status:
    """A runtime's status answers, one per ask: an exception code or an answer."""

    def __init__(self, *answers: grpc.StatusCode | None) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def __call__(self, method: str, request: bytes) -> bytes:
        self.asked += 1
        code = self.answers.pop(0)
        if code is not None:
            raise _RpcError(code)
        return pod_status("p1") if method == "PodSandboxStatus" else container_status("c1", "p1")


class _RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


async def test_a_removal_nobody_saw_end_drops_the_record_once_the_runtime_says_it_is_gone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from runtimeproxy.hookpath import store as store_module

    monkeypatch.setattr(store_module, "RECHECK_DELAYS_S", (0, 0, 0))
    runtime = _Status(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)  # restarting, then gone
    store = StateStore(read_backend=runtime)
    store.put_pod("p1", hookapi.PodSandboxHookRequest())
    store.put_container("c1", "p1", hookapi.ContainerResourceHookRequest())
    await store.forget_if_gone("pod", "p1")
    assert "p1" not in store.pods and "c1" not in store.containers and runtime.asked == 2

    kept = _Status(None, None, None)  # the runtime still has it: the removal failed
    store = StateStore(read_backend=kept)
    store.put_container("c1", "p1", hookapi.ContainerResourceHookRequest())
    await store.forget_if_gone("container", "c1")
    assert "c1" in store.containers and kept.asked == 3


async def test_forget_unlisted_drops_records_of_objects_removed_past_the_proxy() -> None:
    """A client on the runtime's own socket removed what a rebuild had read back:
    the resync's listing drops it, reads nothing, and keeps what a call wrote meanwhile."""
    backend = Backend()  # lists p1 and c1 only
    store = StateStore(read_backend=backend)
    store.put_pod("p1", hookapi.PodSandboxHookRequest())
    store.put_pod("gone-pod", hookapi.PodSandboxHookRequest())
    store.put_container("gone-ctr", "p1", hookapi.ContainerResourceHookRequest())
    await _with_a_write_while_listing(store, backend, store.forget_unlisted())
    assert set(store.pods) == {"p1", "new-pod"} and store.containers == {} and store.container_pod == {}
    assert backend.calls == ["ListPodSandbox", "ListContainers"] and store._listings == []


@pytest.mark.parametrize("first", [grpc.StatusCode.UNAVAILABLE, b"\xff garbled"], ids=["unavailable", "garbled"])
async def test_resync_lists_only_while_the_runtime_is_connected_and_survives_a_failed_listing(first) -> None:  # type: ignore[no-untyped-def]
    backend = _Listing(first)
    store = StateStore(read_backend=backend)
    store.put_pod("gone-pod", hookapi.PodSandboxHookRequest())
    connected = _Connected(answers=[False, False, True, True])
    resync = asyncio.ensure_future(store.resync_every(0, connected))
    try:
        async with asyncio.timeout(5):
            while "gone-pod" in store.pods:
                assert not resync.done(), resync  # the loop must outlive a failed listing
                await asyncio.sleep(0)
    finally:
        resync.cancel()
        await asyncio.gather(resync, return_exceptions=True)
    # Not asked while away; the first listing failed (logged), the next one dropped it.
    assert connected.asked >= 4 and backend.lists == 2


class _Connected:
    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.asked = answers, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.answers.pop(0) if self.answers else True


class _Listing:
    """A runtime whose first ListPodSandbox fails with ``first`` (a status, or an answer
    that does not decode), and that lists nothing."""

    def __init__(self, first: grpc.StatusCode | bytes) -> None:
        self.first: grpc.StatusCode | bytes | None = first
        self.lists = 0

    async def __call__(self, method: str, request: bytes) -> bytes:
        if method == "ListPodSandbox":
            self.lists += 1
            first, self.first = self.first, None
            if isinstance(first, grpc.StatusCode):
                raise _RpcError(first)
            return first if first is not None else v1.ListPodSandboxResponse().SerializeToString()
        return v1.ListContainersResponse().SerializeToString()
