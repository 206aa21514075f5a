"""Reserved CPUs given as a quantity, saved in stateDir for a restart
(docs/hook-balloons.md, Reserved CPUs kept): a restart keeps them where
what runs cannot tell them, falls back to the deduction, logged, when the
file is missing, damaged or contradicted by what runs, and the file is
written atomically after the start-up rebuild, a reload and hotplug.
Machines as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks import statefile
from hooks.balloons.balloon import Member
from hooks.balloons.config import PodContext, parse_config
from hooks.balloons.planning import Restored
from hooks.balloons.savedreserved import ReservedFile, SavedReserved, fingerprint
from hooks.balloons.savedset import SavedSet
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology, parse_cpuset, write_synthetic_sysfs

from .test_hotplug import balloons, hook_on_sysfs, set_online
from .test_replan import restarted
from .test_restart_reserved import cpu_0_offline_and_back
from .test_server import FakeRuntime, request

WORK = {"name": "work", "namespaces": ["apps"]}
# No reserved container: nothing running tells the reserved CPUs.
ALONE = {"reservedResources": {"cpu": "1"}, "balloonTypes": [WORK]}
# dns runs on the reserved CPU and every idle one: which of these was reserved it does not tell.
SHARING = {"reservedResources": {"cpu": "1"}, "balloonTypes": [WORK, {"name": "reserved", "shareIdleCPUsInSame": "system"}]}


def saved_in(directory: Path) -> dict[str, Any]:
    """reserved.json's content, but its token (a random id: checked there,
    and left out) and the node that wrote it (the host's machine id, if any:
    test_saved_node checks it)."""
    doc = json.loads((directory / "reserved.json").read_text())
    assert isinstance(doc.pop("token"), str)
    doc.pop("node", None)
    return doc


async def written(hook: BalloonsHook) -> None:
    """What the hook noted is written (its writer task does not run here)."""
    await hook._saved.write_due()
    assert hook._saved.settled


@pytest.mark.parametrize(("config", "pods", "reserved"), [
    (ALONE, [("a", "apps"), ("b", "apps")], "3"),
    (SHARING, [("a", "apps"), ("dns", "kube-system")], "1"),
], ids=["no reserved container", "reserved type sharing idle CPUs"])
async def test_a_restart_keeps_the_saved_reserved_cpus_the_containers_do_not_tell(
    tmp_path: Path, caplog, config: dict[str, Any], pods: list[tuple[str, str]], reserved: str,
) -> None:
    """CPU 0, the first start's pick, offline and back: another CPU is
    reserved since. Deduced, the restart reserved 0 again (no reserved
    container; or dns on 0-1,3-7, whose idle CPUs cannot be told from the
    reserved one): the CPU hotplug chose was lost. Saved, it is kept."""
    state = tmp_path / "state"
    deduced, deduced_root = await cpu_0_offline_and_back(tmp_path / "deduced", config, pods)
    hook, root = await cpu_0_offline_and_back(tmp_path, {**config, "stateDir": str(state)}, pods)
    await written(hook)
    assert hook.status()["reserved_cpus"] == deduced.status()["reserved_cpus"] == reserved
    assert saved_in(state)["reserved_cpus"] == reserved
    again, _ = await restarted(deduced, tmp_path / "deduced", deduced_root, config)
    assert again.status()["reserved_cpus"] == "0"
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again, runtime = await restarted(hook, tmp_path, root, {**config, "stateDir": str(state)})
    assert (again.status()["reserved_cpus"], runtime.updates) == (reserved, [])
    assert balloons(again) == balloons(hook)
    assert f"reserved CPUs {reserved} at start: the saved set in {state / 'reserved.json'}" in caplog.text


async def test_the_reserved_cpus_are_saved_after_start_up_hotplug_and_reloads(tmp_path: Path) -> None:
    """Not before the start-up rebuild (a reload then: the file holds what
    the restart is to keep); then at each change of the reserved CPUs or
    the config, and to a new stateDir from its reload on, the file in the
    one left removed: a later start naming it would trust a set no longer
    kept (before: left there)."""
    state, config_file = tmp_path / "state", tmp_path / "balloons.yaml"
    config = {**ALONE, "stateDir": str(state)}
    root = tmp_path / "sys"
    write_synthetic_sysfs(root, Topology.synthetic(1, 2, 4, 1))
    hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config(config), sysfs_root=root, runtime=FakeRuntime())
    config_file.write_text(yaml.safe_dump(config))
    assert await hook.reload(config_file)
    await written(hook)
    assert not state.exists()
    await hook.rebuild()
    await written(hook)
    assert saved_in(state) == {"version": 1, "reserved_cpus": "0", "config": fingerprint(parse_config(config))}
    set_online(root, "1-7")
    await hook.reconcile()
    await written(hook)
    assert saved_in(state)["reserved_cpus"] == hook.status()["reserved_cpus"] == "1"
    changed = {**config, "balloonTypes": [{**WORK, "maxCPUs": 2}]}
    config_file.write_text(yaml.safe_dump(changed))
    assert await hook.reload(config_file)
    await written(hook)
    expected = {"version": 1, "reserved_cpus": "1", "config": fingerprint(parse_config(changed))}
    assert saved_in(state) == expected
    moved = tmp_path / "elsewhere"
    config_file.write_text(yaml.safe_dump({**changed, "stateDir": str(moved)}))
    assert await hook.reload(config_file)
    await written(hook)
    assert saved_in(moved) == expected
    assert sorted(p.name for p in moved.iterdir()) == ["balloons.json", "reserved.json"]  # no temporary file left
    assert list(state.iterdir()) == []
    config_file.write_text(yaml.safe_dump({**changed, "stateDir": None}))  # off
    assert await hook.reload(config_file)
    await written(hook)
    assert list(moved.iterdir()) == []


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", "is not JSON"),
    ('{"version": 2, "reserved_cpus": "3", "config": "x"}', "is not a version 1 reserved-CPUs file"),
    ('{"version": 1, "reserved_cpus": "3-", "config": "x"}', "has a bad reserved_cpus"),
    ('{"version": 1, "reserved_cpus": "", "config": "x"}', "names no reserved CPU"),
    ('{"version": 1, "reserved_cpus": "3"}', "lacks reserved_cpus or config"),
    ('{"version": 1, "reserved_cpus": "9", "config": "x"}', "names CPUs 9, none of them online"),
    ('{"version": 1, "reserved_cpus": "1,3", "config": "x"}', "names CPUs 1,3, but container apps/pod-a/app runs on 1-2, some of them only"),
    ('{"version": 1, "reserved_cpus": "1", "config": "FP"}',
     "names CPUs 1, but container apps/pod-a/app of balloon type work runs on 1-2, not the reserved CPUs alone"),
    ('{"version": 1, "reserved_cpus": "3,5", "config": "FP"}', "names 2 CPUs, where the config it was saved under asks 1"),
])
async def test_a_damaged_or_contradicted_file_is_logged_and_the_reserved_cpus_deduced(
    tmp_path: Path, caplog, text: str, why: str
) -> None:
    """a and b run on 1-2: deduced, the first start's pick, 0, is reserved;
    the file is then written again with it."""
    state = tmp_path / "state"
    config = {**ALONE, "stateDir": str(state)}
    hook, _, root = await hook_on_sysfs(tmp_path, config)
    for uid in "ab":
        await hook.pre_create_container(request(uid, "app", shares=1024))
        await hook.pre_start_container(request(uid, "app", cid=f"c-{uid}"))
    assert await hook.apply_moves()
    await written(hook)
    (state / "reserved.json").write_text(text.replace("FP", fingerprint(parse_config(config))))
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again, runtime = await restarted(hook, tmp_path, root, config)
    await written(again)
    assert (again.status()["reserved_cpus"], runtime.updates) == ("0", [])
    [record] = [r for r in caplog.records if r.getMessage().startswith("reserved CPUs 0 at start")]
    assert record.levelno == logging.WARNING
    assert f"deduced from the CPUs the containers run on: the saved set in {state / 'reserved.json'} {why}" in record.getMessage()
    assert saved_in(state)["reserved_cpus"] == "0"


def found(*running_on: tuple[str, str]) -> list[Restored]:
    """Each (namespace, cpuset) a pod's one container found running on it."""
    return [Restored(Member((f"p{i}", "c"), ns, f"p{i}", 100, f"id-{i}"), PodContext(ns, f"p{i}", "c"), parse_cpuset(cpus))
            for i, (ns, cpus) in enumerate(running_on)]


async def test_a_reserved_container_on_none_of_the_saved_cpus_contradicts_them_unless_the_config_changed(tmp_path: Path) -> None:
    """dns (reserved type) on 0 and work on 1-2, the saved set 5: dns was
    not moved there (the hook stopped first), or the file is another's. With
    a changed config dns may be of the reserved type only now: kept."""
    config = parse_config({**ALONE, "stateDir": str(tmp_path)})
    topology = Topology.synthetic(1, 2, 4, 1)
    saved = SavedSet(str(tmp_path))
    saved.record(config, frozenset({5}))
    await saved.write_due()
    running_on = found(("kube-system", "0"), ("apps", "1-2"))
    kept = saved.at_start.restart(config, topology, running_on)[0]
    assert (kept.reserved, kept.level) == (None, logging.WARNING)
    assert "container kube-system/p0/c of the reserved balloon runs on 0, none of them" in kept.why
    other = parse_config({**ALONE, "reservedPoolNamespaces": ["infra"]})
    kept = saved.at_start.restart(other, topology, running_on)[0]
    assert (kept.reserved, kept.level) == (frozenset({5}), logging.INFO)
    assert kept.why.endswith("saved under another config: kept as a reload of this one keeps them")
    # A reserved CPU offline now: the rest kept, topped up as after hotplug; not pinned says nothing.
    two = parse_config({**ALONE, "reservedResources": {"cpu": "2"}, "stateDir": str(tmp_path)})
    saved.record(two, frozenset({5, 6}))
    await saved.write_due()
    online = Topology({cpu: info for cpu, info in topology.cpus.items() if cpu != 6})
    kept = saved.at_start.restart(two, online, found(("kube-system", "5"), ("apps", "0-5,7")))[0]
    assert kept.reserved == frozenset({5}) and "CPUs 6 of it offline now: topped up as after hotplug" in kept.why


def test_a_missing_file_and_no_state_dir_deduce_and_say_so(tmp_path: Path) -> None:
    config = parse_config(ALONE)
    topology = Topology.synthetic(1, 2, 4, 1)
    assert SavedSet("").at_start.restart(config, topology, [])[0] == (
        None, "deduced from the CPUs the containers run on (stateDir not set: not saved)", logging.INFO)
    kept = SavedSet(str(tmp_path / "state")).at_start.restart(config, topology, [])[0]
    assert kept == (None, f"deduced from the CPUs the containers run on: none saved in {tmp_path / 'state' / 'reserved.json'} "
                          "(the first start with this stateDir, or the last write failed)", logging.INFO)


def test_a_write_cut_short_leaves_the_old_file_whole_and_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    file = ReservedFile(tmp_path)
    file.save(SavedReserved(frozenset({1}), "a"))

    def power_cut(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(statefile.os, "fsync", power_cut)
    with pytest.raises(OSError):
        file.save(SavedReserved(frozenset({2}), "b"))
    assert file.load() == SavedReserved(frozenset({1}), "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reserved.json"]


def test_a_temporary_file_a_killed_hook_left_is_removed_at_the_next_start(tmp_path: Path, caplog) -> None:
    """Killed before its rename, the hook left the new set in a temporary
    file: the one in place is the last whole one."""
    file = ReservedFile(tmp_path)
    file.save(SavedReserved(frozenset({1}), "a"))
    (tmp_path / ".reserved.json.k1ll3d.tmp").write_text('{"version": 1, "reserved_cpus": "2"')
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        assert file.load() == SavedReserved(frozenset({1}), "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reserved.json"]
    assert "balloons removed a temporary state file a stopped hook left" in caplog.text


async def test_a_failed_write_removes_the_file_and_is_tried_again_at_the_next_reconcile_pass(tmp_path: Path, monkeypatch, caplog) -> None:
    """Left in place, the old set would be kept by a restart where what runs
    does not contradict it: 0, not reserved since the hotplug reserved 1."""
    state = tmp_path / "state"
    hook, _, root = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(state)})
    await written(hook)
    assert saved_in(state)["reserved_cpus"] == "0"
    real = ReservedFile.save

    tries = 0

    def full(self: ReservedFile, saved: SavedReserved) -> None:
        nonlocal tries
        tries += 1
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ReservedFile, "save", full)
    set_online(root, "1-7")
    with caplog.at_level(logging.WARNING, logger="hooks.balloons"):
        await hook.reconcile()
        await written(hook)
        await hook.reconcile()  # tried again, not logged again
        await written(hook)
    assert hook.status()["reserved_cpus"] == "1" and not (state / "reserved.json").exists()
    [warning] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cannot save")]
    assert warning.startswith(f"cannot save the reserved CPUs 1 and the balloons in {state}: writing reserved.json failed")
    assert "No space left on device" in warning
    assert tries == 2
    monkeypatch.setattr(ReservedFile, "save", real)
    await hook.reconcile()
    await written(hook)
    assert saved_in(state)["reserved_cpus"] == "1"
    assert sorted(os.listdir(state)) == ["balloons.json", "reserved.json"]
