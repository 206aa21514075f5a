"""CPU and memory hotplug: the hook re-plans its balloons on the CPUs and
memory nodes online now, noticed at the next reconcile pass or container
placement. Machines are faked as sysfs trees; a CPU goes offline as the
kernel shows it, in ``cpu/online`` (its ``cpuN`` directory stays).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from hooks.balloons.config import parse_config
from hooks.balloons.server import BalloonsHook
from hooks.balloons.status import render
from hooks.balloons.topology import Topology, parse_cpuset, write_synthetic_sysfs

from ..test_config_mistakes import LAUGHS_SHOWN, inline_laughs
from .test_server import FakeRuntime, request

# Two NUMA nodes with memory: CPUs 0-3 on node 0, 4-7 on node 1.
WORK = {
    "reservedResources": {"cpu": "cpuset:0"},
    "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxBalloons": 2, "preferNewBalloons": True}],
}


def set_online(root: Path, cpus: str) -> None:
    (root / "devices" / "system" / "cpu" / "online").write_text(cpus + "\n")


def set_memory_nodes(root: Path, nodes: str) -> None:
    (root / "devices" / "system" / "node" / "has_memory").write_text(nodes + "\n")


def full_reads(monkeypatch) -> list[Path]:
    """The roots Topology.from_sysfs reads from now on (still read)."""
    reads: list[Path] = []
    real = Topology.from_sysfs.__func__  # type: ignore[attr-defined]

    def spy(cls: type[Topology], root: Path) -> Topology:
        reads.append(root)
        return real(cls, root)

    monkeypatch.setattr(Topology, "from_sysfs", classmethod(spy))
    return reads


def balloons(hook: BalloonsHook) -> list[tuple[str, str, list[str]]]:
    """Each balloon in the status: its name, CPUs and containers' ids."""
    return [(b["name"], b["cpus"], [c["id"] for c in b["containers"]]) for b in hook.status()["balloons"]]


async def hook_on_sysfs(
    tmp_path: Path, config: dict[str, Any] = WORK, shape: Topology | None = None, **options: Any
) -> tuple[BalloonsHook, FakeRuntime, Path]:
    """``options``: BalloonsHook's (machine_id_path, say)."""
    root = tmp_path / "sys"
    write_synthetic_sysfs(root, shape or Topology.synthetic(1, 2, 4, 1))
    runtime = FakeRuntime()
    hook = BalloonsHook(str(tmp_path / "balloons.sock"), parse_config(config), sysfs_root=root, runtime=runtime, **options)
    await hook.rebuild()
    return hook, runtime, root


async def two_pods(hook: BalloonsHook) -> None:
    """Pod a's container c-a on node 0's CPUs 1-2, pod b's c-b on node 1's 4-5, both running."""
    for uid, cpus, mems in (("a", "1-2", "0"), ("b", "4-5", "1")):
        answer = await hook.pre_create_container(request(uid, "app", shares=2048))
        assert (answer.container_resources.cpuset_cpus, answer.container_resources.cpuset_mems) == (cpus, mems)
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    assert await hook.apply_moves()


async def test_a_balloon_whose_cpu_went_offline_keeps_the_rest_and_grows_back(tmp_path, caplog) -> None:
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await two_pods(hook)
    set_online(root, "0-4,6-7")  # CPU 5, one of b's, goes offline
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await hook.reconcile()  # the next pass notices
        assert await hook.apply_moves()
    # b keeps CPU 4 and takes 6 next to it on node 1, not a fresh pair elsewhere; a stays as it was.
    assert runtime.updates == [("c-b", "4,6", "1")]
    assert "CPU topology changed (hotplug)" in caplog.text and 'cpus "0-4,6-7"' in caplog.text
    status = hook.status()
    assert (status["online_cpus"], status["free_cpus"], status["topology_problem"]) == ("0-4,6-7", "3,7", None)

    set_online(root, "0-7")  # back online: free for any balloon again
    await hook.reconcile()
    assert await hook.apply_moves() and len(runtime.updates) == 1  # no balloon needed it: nothing moves
    assert hook.status()["free_cpus"] == "3,5,7"


async def test_a_container_keeps_the_cpus_of_its_balloon_that_stay_online(tmp_path) -> None:
    """Hyperthreads: cores {0,4} {1,5} {2,6} {3,7}. Placed anew, b would take
    the whole free core 3-7 and leave CPU 2, which it runs on."""
    hook, runtime, root = await hook_on_sysfs(tmp_path, shape=Topology.synthetic(1, 1, 4, 2))
    for uid, cpus in (("a", "1,5"), ("b", "2,6")):  # a whole core each
        answer = await hook.pre_create_container(request(uid, "app", shares=2048))
        assert answer.container_resources.cpuset_cpus == cpus
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    set_online(root, "0-5,7")
    await hook.reconcile()
    assert await hook.apply_moves()
    assert runtime.updates == [("c-b", "2,4", "0")]


async def test_a_new_container_is_not_given_a_cpu_gone_offline(tmp_path) -> None:
    hook, _, root = await hook_on_sysfs(tmp_path)
    set_online(root, "0,2-7")  # before any reconcile pass
    answer = await hook.pre_create_container(request("a", "app", shares=1024))
    assert answer.container_resources.cpuset_cpus == "2"


async def test_a_move_due_when_a_cpu_goes_offline_is_sent_to_the_cpus_online_now(tmp_path, caplog) -> None:
    """Pod a's side container joins its balloon, which grows from 1-2 to
    1-3: c-a's move is due when CPU 3 goes offline. The move reads the
    online CPUs first: c-a goes to 1-2,6 (node 0 has no other CPU free).
    It was sent to 1-3, which runc cannot write under cgroup v1, and sent
    again every 5 s until the next reconcile pass saw the hotplug."""
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await two_pods(hook)
    answer = await hook.pre_create_container(request("a", "side", shares=1024))
    assert answer.container_resources.cpuset_cpus == "1-3"
    set_online(root, "0-2,4-7")
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        assert await hook.apply_moves()
    assert "CPU topology changed (hotplug)" in caplog.text
    assert runtime.updates[-1] == ("c-a", "1-2,6", "0-1")
    assert all(3 not in parse_cpuset(cpus) for _, cpus, _ in runtime.updates)


async def test_a_node_that_lost_its_memory_is_no_longer_in_any_cpuset_mems(tmp_path) -> None:
    hook, runtime, root = await hook_on_sysfs(tmp_path)
    await two_pods(hook)
    set_memory_nodes(root, "0")  # node 1's memory goes offline: its CPUs take node 0's
    await hook.reconcile()
    assert await hook.apply_moves()
    assert runtime.updates == [("c-b", "4-5", "0")]


async def test_a_config_the_cpus_online_no_longer_fit_keeps_the_plan_and_says_so(tmp_path, caplog) -> None:
    config = {**WORK, "reservedResources": {"cpu": "cpuset:0-1"}}
    hook, runtime, root = await hook_on_sysfs(tmp_path, config)
    await hook.pre_create_container(request("k", "dns", ns="kube-system"))
    set_online(root, "0,2-7")  # a reserved CPU goes offline
    with caplog.at_level(logging.ERROR, logger="hooks.balloons"):
        await hook.reconcile()
    assert "balloons stay as they were planned" in caplog.text and "reservedResources.cpu" in caplog.text
    status = hook.status()
    assert status["reserved_cpus"] == "0-1" and "reservedResources.cpu" in status["topology_problem"]
    assert "balloons stay as planned before" in render(status)
    # Not tried again at every call (nor logged again) until the CPUs change again.
    caplog.clear()
    await hook.pre_create_container(request("k", "proxy", ns="kube-system"))
    assert "balloons stay as they were planned" not in caplog.text
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

    set_online(root, "0-7")  # back: the config fits again
    await hook.reconcile()
    assert hook.status()["topology_problem"] is None

    # Or a reload that fits the machine as it is now.
    set_online(root, "0,2-7")
    await hook.reconcile()
    assert hook.status()["topology_problem"] is not None
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump({**WORK, "reservedResources": {"cpu": "cpuset:0"}}))
    assert await hook.reload(path)
    status = hook.status()
    assert (status["reserved_cpus"], status["topology_problem"]) == ("0", None)
    assert await hook.apply_moves()
    assert runtime.updates == []  # the kube-system containers have no id yet: placed, not moved


async def test_a_topology_given_rather_than_read_is_not_watched(tmp_path) -> None:
    """Tests give the hook a synthetic machine: it must not compare it with the host's /sys."""
    hook = BalloonsHook(str(tmp_path / "balloons.sock"), parse_config(WORK), topology=Topology.synthetic(1, 1, 64, 1),
                        runtime=FakeRuntime())
    await hook.rebuild()
    await hook.reconcile()
    assert hook.status()["online_cpus"] == "0-63"


QUANTITY = {**WORK, "reservedResources": {"cpu": "1000m"}}


async def three_pods(hook: BalloonsHook) -> None:
    """Pods a and b as in two_pods, and kube-system's c-k on the reserved CPU 0."""
    answer = await hook.pre_create_container(request("k", "dns", ns="kube-system"))
    assert answer.container_resources.cpuset_cpus == "0"
    await hook.pre_start_container(request("k", "dns", ns="kube-system", cid="c-k"))
    await two_pods(hook)


async def test_reserved_cpus_given_as_a_quantity_stay_where_they_are_after_hotplug(tmp_path) -> None:
    """Picked afresh on the new CPUs, the reserved CPU went to 4 and took it from b."""
    hook, runtime, root = await hook_on_sysfs(tmp_path, QUANTITY)
    await three_pods(hook)
    set_online(root, "0-5,7")  # CPU 6, free, goes offline
    await hook.reconcile()
    assert await hook.apply_moves()
    assert runtime.updates == []
    status = hook.status()
    assert (status["reserved_cpus"], status["free_cpus"]) == ("0", "3,7")


async def test_a_reserved_cpu_gone_offline_is_replaced_by_a_cpu_no_container_runs_on(tmp_path) -> None:
    hook, runtime, root = await hook_on_sysfs(tmp_path, QUANTITY)
    await three_pods(hook)
    set_online(root, "1-7")  # the reserved CPU 0 goes offline: a's 1-2 and b's 4-5 stay theirs
    await hook.reconcile()
    assert await hook.apply_moves()
    assert runtime.updates == [("c-k", "3", "0")]
    assert hook.status()["reserved_cpus"] == "3"


async def test_a_reload_keeps_the_reserved_cpus_of_a_quantity(tmp_path) -> None:
    """Same config: the same CPU as before. More CPUs reserved: the old ones
    and the nearest no container runs on (not a's CPU 1)."""
    hook, runtime, _ = await hook_on_sysfs(tmp_path, QUANTITY)
    await three_pods(hook)
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(QUANTITY))
    assert await hook.reload(path)
    assert await hook.apply_moves()
    assert (hook.status()["reserved_cpus"], runtime.updates) == ("0", [])
    path.write_text(yaml.safe_dump({**QUANTITY, "reservedResources": {"cpu": "2"}}))
    assert await hook.reload(path)
    assert await hook.apply_moves()
    assert (hook.status()["reserved_cpus"], runtime.updates) == ("0,3", [("c-k", "0,3", "0")])


async def test_a_reload_with_a_key_given_twice_with_different_values_keeps_the_last_good_config(tmp_path, caplog) -> None:
    hook, _, _ = await hook_on_sysfs(tmp_path, QUANTITY)
    path = tmp_path / "balloons.yaml"
    path.write_text("reservedResources:\n  cpu: '1'\n  cpu: '2'\n")
    assert not await hook.reload(path)
    assert hook.status()["reserved_cpus"] == "0"
    assert "config reload failed, keeping the last good config" in caplog.text and "to different values" in caplog.text


async def test_a_reload_shows_a_billion_laughs_cut_short(tmp_path, caplog) -> None:
    hook, _, _ = await hook_on_sysfs(tmp_path, QUANTITY)
    path = tmp_path / "balloons.yaml"
    path.write_text(f"reservedResources: {{cpu: 1}}\nreservedPoolNamespaces: {inline_laughs(6)}\n")
    assert not await hook.reload(path)
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    message = record.getMessage()
    assert LAUGHS_SHOWN in message and len(message) < 400, message[:300]


async def test_an_unreadable_node_online_file_is_no_hotplug(tmp_path, caplog, monkeypatch) -> None:
    """Only cpu/online and node/has_memory are compared: node/online (read for
    the NUMA distances alone) going missing changes nothing."""
    hook, _, root = await hook_on_sysfs(tmp_path)
    (root / "devices" / "system" / "node" / "online").unlink()
    reads = full_reads(monkeypatch)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await hook.reconcile()
        await hook.pre_create_container(request("a", "app"))
    assert reads == [] and "hotplug" not in caplog.text


def warnings_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_unreadable_or_malformed_online_cpus_are_warned_once_each(tmp_path, caplog) -> None:
    hook, _, root = await hook_on_sysfs(tmp_path)
    online = root / "devices" / "system" / "cpu" / "online"
    online.unlink()
    with caplog.at_level(logging.WARNING, logger="hooks.balloons"):
        await hook.reconcile()
        await hook.pre_create_container(request("a", "app"))
        await hook.pre_create_container(request("b", "app"))
        assert len(warnings_in(caplog)) == 1 and "cannot read online CPUs" in caplog.text
        online.write_text("0-3,x\n")  # another failure: warned too, once
        await hook.pre_create_container(request("c", "app"))
        await hook.reconcile()
        assert len(warnings_in(caplog)) == 2 and "'x'" in warnings_in(caplog)[1]
        online.write_text("0-7\n")  # readable again, as it was: no change
        await hook.reconcile()
    assert len(warnings_in(caplog)) == 2 and hook.status()["online_cpus"] == "0-7"


async def test_an_online_cpu_without_its_topology_is_read_once_until_the_input_changes(tmp_path, caplog, monkeypatch) -> None:
    """CPU 8 is online but has no topology directory: the full read fails. Not
    done again (~50 ms for 256 CPUs, under the hook's lock) at every
    PreCreateContainer for the same cpu/online; a reconcile pass tries again."""
    hook, _, root = await hook_on_sysfs(tmp_path)
    reads = full_reads(monkeypatch)
    set_online(root, "0-8")
    with caplog.at_level(logging.WARNING, logger="hooks.balloons"):
        for uid in "abc":
            await hook.pre_create_container(request(uid, "app"))
        assert len(reads) == 1
        assert len(warnings_in(caplog)) == 1 and "cannot read the topology of cpu8" in caplog.text
        await hook.reconcile()  # tried again, not warned again
        assert (len(reads), len(warnings_in(caplog))) == (2, 1)
        set_online(root, "0-6")  # then CPU 7 goes offline and 8 is gone: read, and followed
        await hook.pre_create_container(request("d", "app"))
    assert len(reads) == 3 and hook.status()["online_cpus"] == "0-6"


async def test_a_container_in_the_default_balloon_stays_there_at_hotplug(tmp_path) -> None:
    """Under Ignore, work (maxBalloons 1, maxCPUs 1) held a on CPU 1 and b
    went to the default balloon, on CPU 2; a gone, work has room for b.
    CPUs coming online leave b where it runs, as placement does; its CPU
    going offline moves it, within the default balloon. (A re-plan put b
    in a balloon of work made of its CPU at either.)"""
    config = {"reservedResources": {"cpu": "cpuset:0"}, "onExhausted": "Ignore",
              "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxBalloons": 1, "maxCPUs": 1}]}
    hook, runtime, root = await hook_on_sysfs(tmp_path, config)
    set_online(root, "0-6")
    await hook.reconcile()
    for uid in "ab":
        await hook.pre_create_container(request(uid, "app", shares=1024))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    await hook.post_stop_container(request("a", "app", cid="c-a"))
    assert await hook.apply_moves()
    assert balloons(hook) == [("reserved[0]", "0", []), ("default[0]", "2", ["c-b"])]
    updates = list(runtime.updates)

    set_online(root, "0-7")  # CPU 7 comes online
    await hook.reconcile()
    assert await hook.apply_moves()
    assert (hook.status()["online_cpus"], balloons(hook), runtime.updates) == (
        "0-7", [("reserved[0]", "0", []), ("default[0]", "2", ["c-b"])], updates)

    set_online(root, "0-1,3-7")  # the default balloon's CPU 2 goes offline
    await hook.reconcile()
    assert await hook.apply_moves()
    [(name, cpus, ids)] = [b for b in balloons(hook) if b[0] != "reserved[0]"]
    assert (name, ids, runtime.updates[len(updates):]) == ("default[0]", ["c-b"], [("c-b", cpus, "0")])
    assert cpus and "2" not in cpus.split(",")
