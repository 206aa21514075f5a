"""The hook's handlers against a fake runtime, no processes: placement answers,
moves of running containers, restore after a restart, reload, status."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json

import grpc
import pytest
import yaml

from cri_api.hookapi import api_pb2
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.runtime import ExitedContainer, FoundContainer, Listing
from hooks.balloons.server import BalloonsHook
from hooks.balloons.status import read_status, render
from hooks.balloons.topology import Topology, parse_cpuset
from hooks.builtin import HookConfigInvalid, load_builtin
from hooks.sdk import HookAbort

CONFIG = {
    "reservedResources": {"cpu": "cpuset:0"},
    "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxCPUs": 3, "maxBalloons": 1}],
}


class FakeRuntime:
    endpoint = "/fake"
    closed = False

    def __init__(self) -> None:
        self.live: list[FoundContainer] = []
        self.exited: list[ExitedContainer] = []
        self.updates: list[tuple[str, str, str]] = []
        self.fail_with: grpc.StatusCode | None = None
        self.refused: set[str] = set()  # container ids whose moves fail (FAILED_PRECONDITION)
        self.pod_listings: list[str] = []

    async def list_containers(self) -> Listing:
        return Listing(list(self.live), list(self.exited))

    async def pod_containers(self, pod_uid: str, timeout: float) -> tuple[set, list[ExitedContainer]]:
        self.pod_listings.append(pod_uid)
        return {f.key for f in self.live if f.pod_uid == pod_uid}, [e for e in self.exited if e.key[0] == pod_uid]

    async def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        if self.fail_with is not None or container_id in self.refused:
            code = self.fail_with or grpc.StatusCode.FAILED_PRECONDITION
            raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "fake")
        self.updates.append((container_id, cpus, mems))

    async def retarget(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def close(self) -> None:
        pass

    def reopen(self) -> None:  # (a start under the lock: RuntimeClient.reopen)
        pass


def request(uid: str, name: str, ns: str = "apps", shares: int = 1024, cid: str = "", **annotations: str):
    return api_pb2.ContainerResourceHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(name=f"pod-{uid}", uid=uid, namespace=ns),
        container_meta=api_pb2.ContainerMetadata(name=name, id=cid),
        container_resources=api_pb2.LinuxContainerResources(cpu_shares=shares),
        pod_annotations=annotations,
    )


async def started(tmp_path, config=CONFIG, runtime=None, **options) -> tuple[BalloonsHook, FakeRuntime]:
    runtime = runtime or FakeRuntime()
    hook = BalloonsHook(str(tmp_path / "balloons.sock"), parse_config(config), topology=Topology.synthetic(1, 1, 8, 1),
                        runtime=runtime, **options)
    await hook.rebuild()
    return hook, runtime


def test_registered_as_a_builtin_and_bad_configs_are_refused() -> None:
    assert load_builtin("balloons") is BalloonsHook
    with pytest.raises(HookConfigInvalid, match="reservedResources.cpu: required"):
        BalloonsHook.from_config("/tmp/x.sock", {})
    with pytest.raises(HookConfigInvalid, match="not available"):
        BalloonsHook.from_config("/tmp/x.sock", {"reservedResources": {"cpu": "cpuset:4096"}})


async def test_containers_get_their_balloon_cpus_and_running_ones_move_when_it_grows(tmp_path) -> None:
    hook, runtime = await started(tmp_path)
    system = await hook.pre_create_container(request("k", "dns", ns="kube-system"))
    assert (system.container_resources.cpuset_cpus, system.container_resources.cpuset_mems) == ("0", "0")
    first = await hook.pre_create_container(request("a", "app", shares=1024))
    assert first.container_resources.cpuset_cpus == "1"
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    second = await hook.pre_create_container(request("b", "app", shares=512))
    assert second.container_resources.cpuset_cpus == "1-2"
    assert await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-2", "0")]
    # The move comes back through the proxy as an update without shares: same answer.
    again = await hook.pre_update_container_resources(request("a", "app", shares=0, cid="c-a"))
    assert again.container_resources.cpuset_cpus == "1-2"
    assert await hook.apply_moves() and len(runtime.updates) == 1
    # b goes; a's balloon shrinks and a moves back.
    await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="b")))
    await hook.apply_moves()
    assert runtime.updates[-1] == ("c-a", "1", "0")


async def test_a_container_first_seen_at_its_start_is_moved_to_its_balloon(tmp_path) -> None:
    # Its PreCreateContainer never reached the hook (down, or failed under
    # Ignore); the proxy applies no PreStartContainer answer.
    hook, runtime = await started(tmp_path)
    assert await hook.pre_start_container(request("a", "app", shares=1024, cid="c-a")) is None
    assert await hook.apply_moves()
    assert runtime.updates == [("c-a", "1", "0")]
    assert await hook.apply_moves() and len(runtime.updates) == 1  # once


async def test_kube_system_stays_reserved_when_other_namespaces_are_named(tmp_path) -> None:
    hook, _ = await started(tmp_path, {**CONFIG, "reservedPoolNamespaces": ["monitoring"]})
    for ns in ("kube-system", "monitoring"):
        answer = await hook.pre_create_container(request(f"p-{ns}", "c", ns=ns, shares=8192))
        assert answer.container_resources.cpuset_cpus == "0"


async def test_a_reload_moves_containers_through_a_changed_runtime_endpoint(tmp_path) -> None:
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    hook, runtime = await started(tmp_path, CONFIG, config_path=path)
    path.write_text(yaml.safe_dump({**CONFIG, "runtimeEndpoint": "/run/other.sock"}))
    assert await hook.reload(path)
    assert runtime.endpoint == "/run/other.sock"


async def test_a_besteffort_container_gets_a_cpu_of_its_own_not_the_reserved_ones(tmp_path) -> None:
    hook, _ = await started(tmp_path)
    answer = await hook.pre_create_container(request("be", "app", shares=2))
    assert answer.container_resources.cpuset_cpus == "1"
    second = await hook.pre_create_container(request("be", "side", shares=2))  # the same pod: no more CPUs
    assert second.container_resources.cpuset_cpus == "1"
    await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="be")))
    assert not hook.state.pool.of_type("work") or not hook.state.pool.of_type("work")[0].cpus  # given back


async def test_a_pods_finished_init_container_makes_room_for_its_app_container(tmp_path) -> None:
    # maxCPUs 3: init (2 CPUs) and app (2 CPUs) fit only one after the other,
    # as Kubernetes counts them. No stop event comes for a finished init container.
    hook, runtime = await started(tmp_path)
    await hook.pre_create_container(request("a", "init", shares=2048))
    await hook.pre_start_container(request("a", "init", shares=2048, cid="c-init"))
    runtime.exited = [ExitedContainer("c-init", ("a", "init"))]
    answer = await hook.pre_create_container(request("a", "app", shares=2048))
    assert answer.container_resources.cpuset_cpus == "1-2" and runtime.pod_listings == ["a"]
    assert hook.state.pool.balloon_of(("a", "init")) is None
    # Still running (not listed as exited): the app container is refused.
    hook, runtime = await started(tmp_path / "again")
    await hook.pre_create_container(request("a", "init", shares=2048))
    await hook.pre_start_container(request("a", "init", shares=2048, cid="c-init"))
    with pytest.raises(HookAbort) as info:
        await hook.pre_create_container(request("a", "app", shares=2048))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_kubelet_cannot_move_a_container_out_of_its_balloon(tmp_path) -> None:
    hook, _ = await started(tmp_path)
    await hook.pre_create_container(request("a", "app", shares=1024))
    answer = await hook.pre_update_container_resources(request("a", "app", shares=2048, cid="c-a"))
    assert answer.container_resources.cpuset_cpus == "1-2"  # grown with the request, still its balloon
    with pytest.raises(HookAbort) as info:
        await hook.pre_update_container_resources(request("a", "app", shares=8192, cid="c-a"))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_exhausted_fails_or_falls_back_to_default_as_configured(tmp_path) -> None:
    hook, _ = await started(tmp_path)
    await hook.pre_create_container(request("a", "app", shares=3072))
    with pytest.raises(HookAbort) as info:
        await hook.pre_create_container(request("b", "app", shares=1024))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no balloon can take container apps/pod-b/app (1000m CPU)" in info.value.details

    hook, _ = await started(tmp_path / "ignore", {**CONFIG, "onExhausted": "Ignore"})
    await hook.pre_create_container(request("a", "app", shares=3072))
    answer = await hook.pre_create_container(request("b", "app", shares=1024))
    assert answer.container_resources.cpuset_cpus == "4"  # default[0] grew on a free CPU
    assert hook.state.pool.balloon_of(("b", "app")).name == "default[0]"


async def test_unknown_balloon_annotation_is_refused(tmp_path) -> None:
    hook, _ = await started(tmp_path)
    with pytest.raises(HookAbort) as info:
        await hook.pre_create_container(request("a", "app", **{"balloon.balloons.resource-policy.nri.io": "gpu"}))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'gpu'" in info.value.details


async def test_a_restart_restores_assignments_from_running_cpusets(tmp_path) -> None:
    runtime = FakeRuntime()

    def found(uid, name, cid, cpus, shares=1024, ns="apps"):
        return FoundContainer(cid, (uid, name), PodContext(ns, f"pod-{uid}", name), uid, parse_cpuset(cpus), "0", shares)

    runtime.live = [found("a", "app", "c-a", "2-3", 1024), found("b", "app", "c-b", "2-3", 1024),
                    found("k", "dns", "c-k", "0", 2, ns="kube-system"), found("n", "new", "c-n", "")]
    hook, _ = await started(tmp_path, {**CONFIG, "balloonTypes": [{"name": "work", "namespaces": ["*"]}]}, runtime)
    pool = hook.state.pool
    assert pool.balloon_of(("a", "app")) is pool.balloon_of(("b", "app"))
    assert pool.balloon_of(("a", "app")).cpus == {1, 2, 3}  # kept 2-3, grew by one for the newcomer
    assert pool.balloon_of(("n", "new")) is pool.balloon_of(("a", "app"))
    assert pool.balloon_of(("k", "dns")).name == "reserved[0]"
    # the unpinned container joined (and grew) the work balloon; everyone in it moves
    assert await hook.apply_moves()
    assert sorted(runtime.updates) == [("c-a", "1-3", "0"), ("c-b", "1-3", "0"), ("c-n", "1-3", "0")]


async def test_reconcile_releases_vanished_containers_and_adopts_unknown_ones(tmp_path, monkeypatch) -> None:
    hook, runtime = await started(tmp_path)
    await hook.pre_create_container(request("a", "app"))
    monkeypatch.setattr("hooks.balloons.sync.CREATE_GRACE", -1.0)
    runtime.live = [FoundContainer("c-z", ("z", "app"), PodContext("apps", "pod-z", "app"), "z", frozenset(), "", 1024)]
    await hook.reconcile()
    assert hook.state.pool.balloon_of(("a", "app")) is None
    assert hook.state.pool.balloon_of(("z", "app")).members[("z", "app")].container_id == "c-z"


async def test_reload_keeps_the_last_good_config(tmp_path) -> None:
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    hook, runtime = await started(tmp_path, config_path=path)
    await hook.pre_create_container(request("a", "app"))
    await hook.pre_start_container(request("a", "app", cid="c-a"))
    path.write_text("reservedResources: {cpu: 'cpuset:0'}\nballoonTypes: [{name: x, maxCpus: 1}]\n")
    assert not await hook.reload(path)
    assert hook.state.pool.balloon_of(("a", "app")).name == "work[0]"
    path.write_text(yaml.safe_dump({**CONFIG, "balloonTypes": [{"name": "big", "namespaces": ["*"], "minCPUs": 2}]}))
    assert await hook.reload(path)
    assert hook.state.pool.balloon_of(("a", "app")).name == "big[0]"
    assert await hook.apply_moves()
    assert runtime.updates == [("c-a", "1-2", "0")]


@pytest.mark.parametrize("content", [b"a: " + b"[" * 3000 + b"]" * 3000 + b"\n", b"reservedResources: \xff\n"])
async def test_reload_of_yaml_nested_too_deeply_or_not_utf8_keeps_the_last_good_config(tmp_path, content: bytes) -> None:
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    hook, _ = await started(tmp_path, config_path=path)
    await hook.pre_create_container(request("a", "app"))
    path.write_bytes(content)
    assert not await hook.reload(path)  # logged; the hook lives on
    assert hook.state.pool.balloon_of(("a", "app")).name == "work[0]"


async def test_status_socket_answers_the_live_balloons(tmp_path) -> None:
    hook, _ = await started(tmp_path)
    async with hook:
        await hook.pre_create_container(request("a", "app"))
        doc = await read_status(hook.status_socket)
    assert doc["ready"] and doc["reserved_cpus"] == "0"
    work = next(b for b in doc["balloons"] if b["name"] == "work[0]")
    assert work["containers"] == [{"name": "apps/pod-a/app", "id": "", "milli_cpus": 1000}]
    assert 'work[0]{cpus:"1", mems:"0"}' in render(doc)
    assert not hook.status_socket.exists()
    json.dumps(doc)


async def test_the_config_file_is_watched(tmp_path) -> None:
    path = tmp_path / "conf" / "balloons.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(CONFIG))
    hook, _ = await started(tmp_path, config_path=path)
    background = asyncio.create_task(hook.background())
    try:
        # The watcher gives no sign that it watches: write until it has seen a write.
        async with asyncio.timeout(20):
            for attempt in itertools.count():
                new = {**CONFIG, "balloonTypes": [{"name": f"renamed{attempt}", "namespaces": ["*"]}]}
                path.write_text(yaml.safe_dump(new))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1):
                        while not any(t.startswith("renamed") for t in hook.state.pool.types):  # noqa: ASYNC110 - the pool has no change event; bounded
                            await asyncio.sleep(0.02)
                        break
        assert not background.done()
    finally:
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background


async def test_an_older_attempts_stop_does_not_release_its_successor(tmp_path) -> None:
    hook, _ = await started(tmp_path)
    await hook.pre_create_container(request("a", "app"))
    await hook.pre_start_container(request("a", "app", cid="c-1"))
    await hook.pre_create_container(request("a", "app"))  # attempt 1; the stop of attempt 0 was not seen
    await hook.pre_start_container(request("a", "app", cid="c-2"))
    await hook.post_stop_container(request("a", "app", cid="c-1"))
    assert hook.state.pool.balloon_of(("a", "app")).members[("a", "app")].container_id == "c-2"
    await hook.post_stop_container(request("a", "app", cid="c-2"))
    assert hook.state.pool.balloon_of(("a", "app")) is None


async def test_pin_flags_choose_what_the_answer_sets(tmp_path) -> None:
    hook, _ = await started(tmp_path, {**CONFIG, "pinMemory": False})
    answer = await hook.pre_create_container(request("a", "app"))
    assert (answer.container_resources.cpuset_cpus, answer.container_resources.cpuset_mems) == ("1", "")
    assert answer.container_resources.cpu_shares == 0  # only the cpuset: the request keeps the rest
    hook, _ = await started(tmp_path / "none", {**CONFIG, "pinMemory": False, "pinCPU": False})
    assert await hook.pre_create_container(request("a", "app")) is None


SHARED_IDLE = {
    "reservedResources": {"cpu": "cpuset:0"},
    "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxCPUs": 2, "shareIdleCPUsInSame": "system"}],
}


async def _reloaded(tmp_path, config: dict, pods: list[tuple[str, int]]) -> BalloonsHook:
    """``pods`` (uid, CPU shares) created and started under ``config``, then the config file touched."""
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(config))
    hook, _ = await started(tmp_path, config, config_path=path)
    for uid, shares in pods:
        await hook.pre_create_container(request(uid, "app", shares=shares))
        await hook.pre_start_container(request(uid, "app", shares=shares, cid=f"c-{uid}"))
    path.write_text(yaml.safe_dump(config) + "# touched\n")
    assert await hook.reload(path)
    return hook


async def test_a_reload_keeps_balloons_that_share_idle_cpus_apart(tmp_path) -> None:
    """With shareIdleCPUsInSame every container runs on the same idle CPUs as
    well as its balloon's: those alone do not put two containers together."""
    hook = await _reloaded(tmp_path, SHARED_IDLE, [("a", 2048), ("b", 2048)])
    pool = hook.state.pool
    a, b = pool.balloon_of(("a", "app")), pool.balloon_of(("b", "app"))
    assert a is not b and len(a.cpus) == len(b.cpus) == 2 and not a.cpus & b.cpus


@pytest.mark.parametrize("how", ["restart", "reload"])
async def test_balloons_that_share_idle_cpus_with_room_to_merge_stay_apart(tmp_path, how: str) -> None:
    """Two balloons that could hold each other's containers (maxCPUs 3) and
    share their NUMA node's idle CPUs: a rebuild puts them back as they were,
    and moves nothing (before, the first restored took the idle CPUs as its
    own, and the other's container joined it)."""
    config = {**SHARED_IDLE, "balloonTypes": [{**SHARED_IDLE["balloonTypes"][0], "maxCPUs": 3, "shareIdleCPUsInSame": "numa"}]}
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(config))
    runtime = FakeRuntime()
    options = {"topology": Topology.synthetic(1, 2, 4, 2), "runtime": runtime, "config_path": path}
    hook = BalloonsHook(str(tmp_path / "balloons.sock"), parse_config(config), **options)
    await hook.rebuild()
    for uid in ("a", "b", "x", "c"):
        await hook.pre_create_container(request(uid, "app", shares=1024))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="x")))
    await hook.apply_moves()

    def layout(h: BalloonsHook) -> dict[str, tuple[frozenset[int], frozenset[str]]]:
        return {b.name: (frozenset(b.cpus), frozenset(m.pod_uid for m in b.members.values())) for b in h.state.pool.balloons}

    before = layout(hook)
    assert {pods for _, pods in before.values()} == {frozenset(), frozenset({"a", "b"}), frozenset({"c"})}
    runtime.updates.clear()
    if how == "restart":
        runtime.live = [
            FoundContainer(m.container_id, m.key, hook.state.pods[m.key], m.pod_uid, parse_cpuset(hook.state.target(m.key)[0]),
                           hook.state.target(m.key)[1], 1024)
            for _, m in hook.state.pool.members()
        ]
        hook = BalloonsHook(str(tmp_path / "again.sock"), parse_config(config), **options)
        await hook.rebuild()
    else:
        path.write_text(yaml.safe_dump(config) + "# touched\n")
        assert await hook.reload(path)
    assert layout(hook) == before
    assert await hook.apply_moves() and runtime.updates == []


async def test_a_reload_leaves_a_container_on_the_fallback_balloon_if_its_type_is_full(tmp_path) -> None:
    hook = await _reloaded(tmp_path, {**CONFIG, "onExhausted": "Ignore"}, [("a", 3072), ("b", 1024)])
    pool = hook.state.pool
    a, b = pool.balloon_of(("a", "app")), pool.balloon_of(("b", "app"))
    assert a.name == "work[0]" and b.name == "default[0]"
    assert a.requested_milli == 3000 and len(a.cpus) == 3


class _RacyRuntime(FakeRuntime):
    """Lists what runs, then lets hook events happen before answering."""

    def __init__(self) -> None:
        super().__init__()
        self.during_list = None

    async def list_containers(self) -> Listing:
        listed = Listing(list(self.live), list(self.exited))
        if self.during_list is not None:
            during, self.during_list = self.during_list, None
            await during()
        return listed


async def _running(tmp_path, cid: str) -> tuple[BalloonsHook, _RacyRuntime]:
    """Pod a's container started as ``cid``, and listed so by the runtime."""
    runtime = _RacyRuntime()
    hook, _ = await started(tmp_path, runtime=runtime)
    await hook.pre_create_container(request("a", "app", shares=2048))
    await hook.pre_start_container(request("a", "app", cid=cid))
    runtime.live = [FoundContainer(cid, ("a", "app"), PodContext("apps", "pod-a", "app"), "a", frozenset({1, 2}), "0", 2048)]
    return hook, runtime


async def test_a_pod_stopped_while_the_runtime_was_listed_is_not_adopted_again(tmp_path) -> None:
    hook, runtime = await _running(tmp_path, "c-a")

    async def stopped() -> None:
        runtime.live = []
        await hook.post_stop_pod_sandbox(api_pb2.PodSandboxHookRequest(pod_meta=api_pb2.PodSandboxMetadata(uid="a")))

    runtime.during_list = stopped
    await hook.reconcile()
    assert hook.state.pool.balloon_of(("a", "app")) is None


async def test_a_container_restarted_while_the_runtime_was_listed_keeps_its_new_id(tmp_path) -> None:
    hook, runtime = await _running(tmp_path, "c1")

    async def restarted() -> None:
        await hook.post_stop_container(request("a", "app", cid="c1"))
        await hook.pre_create_container(request("a", "app", shares=2048))
        await hook.pre_start_container(request("a", "app", cid="c2"))

    runtime.during_list = restarted
    await hook.reconcile()
    (member,) = [m for _, m in hook.state.pool.members() if m.key == ("a", "app")]
    assert member.container_id == "c2"


def _exited_only(runtime: FakeRuntime, cid: str) -> None:
    """The runtime lists pod a's container ``cid`` as exited, nothing of it live."""
    runtime.live = []
    runtime.exited = [ExitedContainer(cid, ("a", "app"))]


async def test_an_exited_container_is_released_at_the_next_reconcile_not_after_the_grace(tmp_path, caplog) -> None:
    """An init container that finished (or a crashed one waiting for its restart):
    kubelet keeps it, no PostStopContainer comes; its CPUs go back at once."""
    hook, runtime = await _running(tmp_path, "c-a")
    await hook.pre_create_container(request("b", "app", shares=1024))
    assert len(hook.state.pool.balloon_of(("a", "app")).cpus) == 3
    _exited_only(runtime, "c-a")
    runtime.live = [FoundContainer("c-b", ("b", "app"), PodContext("apps", "pod-b", "app"), "b", frozenset(), "", 1024)]
    with caplog.at_level("INFO", logger="hooks.balloons"):
        await hook.reconcile()  # well within CREATE_GRACE of its placement
    pool = hook.state.pool
    assert pool.balloon_of(("a", "app")) is None
    assert len(pool.balloon_of(("b", "app")).cpus) == 1  # the balloon shrank to b's request
    assert "releasing container apps/pod-a/app from balloon work[0] (it exited)" in caplog.text
    assert await hook.apply_moves()
    assert runtime.updates == [("c-b", "1", "0")]


async def test_an_exited_attempt_does_not_release_its_live_successor(tmp_path) -> None:
    hook, runtime = await _running(tmp_path, "c1")
    await hook.pre_create_container(request("a", "app", shares=2048))  # the restart: attempt 1
    runtime.exited = [ExitedContainer("c1", ("a", "app"))]
    runtime.live = [FoundContainer("c2", ("a", "app"), PodContext("apps", "pod-a", "app"), "a", frozenset({1, 2}), "0", 2048)]
    await hook.reconcile()
    assert hook.state.pool.balloon_of(("a", "app")).members[("a", "app")].container_id == "c2"


@pytest.mark.parametrize("new_id", ["", "c2"])
async def test_an_exited_container_whose_key_was_placed_again_waits_for_the_grace(tmp_path, monkeypatch, new_id) -> None:
    """kubelet restarts it: a new PreCreateContainer placed a fresh member (id not known
    yet, or already another one) whose container the runtime may not list yet."""
    hook, runtime = await _running(tmp_path, "c1")
    await hook.pre_create_container(request("a", "app", shares=2048))
    if new_id:
        await hook.pre_start_container(request("a", "app", cid=new_id))
    _exited_only(runtime, "c1")
    await hook.reconcile()
    balloon = hook.state.pool.balloon_of(("a", "app"))
    assert balloon is not None and len(balloon.cpus) == 2
    assert balloon.members[("a", "app")].container_id == new_id
    monkeypatch.setattr("hooks.balloons.sync.CREATE_GRACE", -1.0)  # the grace still applies
    await hook.reconcile()
    assert hook.state.pool.balloon_of(("a", "app")) is None


async def test_an_exit_listed_while_a_hook_event_came_waits_for_the_next_pass(tmp_path) -> None:
    hook, runtime = await _running(tmp_path, "c1")
    _exited_only(runtime, "c1")

    async def updated() -> None:  # any hook event; the member keeps its id, so only the guard holds it
        await hook.pre_update_container_resources(request("a", "app", shares=0, cid="c1"))

    runtime.during_list = updated
    await hook.reconcile()
    assert hook.state.pool.balloon_of(("a", "app")).members[("a", "app")].container_id == "c1"
    await hook.reconcile()  # no event this time: the listing stands
    assert hook.state.pool.balloon_of(("a", "app")) is None
