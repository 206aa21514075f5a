"""A restart finding a move left half done on the reserved CPUs (given as a
quantity) with the balloons saved in stateDir (docs/hook-balloons.md,
Restarts; savedstart.py): the saved balloons are consulted before the saved
reserved set is given up for what runs. They name that set and put the
container found off it back in its balloon, moved, rather than the restart
deducing other reserved CPUs and rebuilding every balloon from the cpusets.
Machine as in test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from hooks.balloons.config import parse_config
from hooks.balloons.savedreserved import ReservedFile
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import format_cpuset

from .test_hotplug import balloons
from .test_replan import running
from .test_restart_reserved import cpu_0_offline_and_back
from .test_hotplug import set_online
from .test_saved_reserved import WORK, written
from .test_server import FakeRuntime

TWO_RESERVED = {"reservedResources": {"cpu": "2"}, "balloonTypes": [WORK]}


async def _restart_with_dns_half_moved(
        tmp_path: Path, config: dict, caplog, renew: bool = False, restart: dict | None = None,
        tamper: Callable[[Path, Path, BalloonsHook], None] | None = None,
) -> tuple[BalloonsHook, BalloonsHook, FakeRuntime, str]:
    """dns (kube-system: the reserved type) and a (apps) placed, CPU 0
    offline and back (the reserved CPUs 1,3 since, not the first start's
    pick), saved; a restarted hook finds dns on one of the two reserved CPUs
    only (its move there not done when the hook stopped). ``renew``: every
    container found of a new pod uid (a stale or copied stateDir);
    ``restart``: the config restarted with (else ``config``); ``tamper``
    (the stateDir, the sysfs root, the first hook) runs before it. The first
    hook, the second, its runtime, the reserved CPUs."""
    hook, root = await cpu_0_offline_and_back(tmp_path, config, [("dns", "kube-system"), ("a", "apps")])
    await written(hook)
    reserved = hook.state.pool.reserved
    assert len(reserved) == 2
    runtime = FakeRuntime()
    runtime.live = [dataclasses.replace(f, cpus=frozenset({min(reserved)})) if f.container_id == "c-dns" else f
                    for f in running(hook)]
    if renew:
        runtime.live = [dataclasses.replace(f, key=(f"new-{f.key[0]}", f.key[1]), pod_uid=f"new-{f.pod_uid}")
                        for f in runtime.live]
    if tamper is not None:
        tamper(Path(config["stateDir"]), root, hook)
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(restart or config), sysfs_root=root, runtime=runtime)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await again.rebuild()
    assert await again.apply_moves()
    return hook, again, runtime, format_cpuset(reserved)


async def test_a_move_half_done_on_the_reserved_cpus_is_put_back_by_the_saved_balloons(tmp_path: Path, caplog) -> None:
    """The reserved CPUs and every balloon as saved, dns alone moved back
    onto both reserved CPUs (before: the saved set refused, "some of them
    only", the reserved CPUs deduced, 0-1, and the balloons rebuilt from the
    cpusets: CPU 3 no longer reserved, dns moved to 0-1)."""
    state = tmp_path / "state"
    hook, again, runtime, reserved = await _restart_with_dns_half_moved(tmp_path, {**TWO_RESERVED, "stateDir": str(state)}, caplog)
    assert again.status()["reserved_cpus"] == reserved
    assert balloons(again) == balloons(hook)
    assert [(cid, cpus) for cid, cpus, _ in runtime.updates] == [("c-dns", reserved)]
    [line] = [r for r in caplog.records if r.getMessage().startswith(f"reserved CPUs {reserved} at start")]
    assert line.levelno == logging.INFO and line.saved
    assert line.getMessage().startswith(
        f"reserved CPUs {reserved} at start: the saved set in {state / 'reserved.json'}, as the saved balloons "
        "written with it name it, which put back the containers found off them (what runs alone: deduced from the "
        "CPUs the containers run on: ")
    assert "some of them only" in line.getMessage()
    [start] = [r for r in caplog.records if r.getMessage().startswith("balloons at start")]
    assert start.saved and start.put_back == [f"kube-system/pod-dns/app in {again.state.pool.balloon_of(('dns', 'app')).name}"]


async def test_without_saved_balloons_such_a_restart_still_deduces(tmp_path: Path, caplog) -> None:
    """Guards existing behaviour: the balloons' file gone (an older hook's
    stateDir), the saved set alone is refused as before, with the warning."""
    state = tmp_path / "state"
    config = {**TWO_RESERVED, "stateDir": str(state)}
    hook, root = await cpu_0_offline_and_back(tmp_path, config, [("dns", "kube-system")])
    await written(hook)
    (state / "balloons.json").unlink()
    reserved = hook.state.pool.reserved
    runtime = FakeRuntime()
    runtime.live = [dataclasses.replace(f, cpus=frozenset({min(reserved)})) for f in running(hook)]
    again = BalloonsHook(str(tmp_path / "restarted.sock"), parse_config(config), sysfs_root=root, runtime=runtime)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await again.rebuild()
    [line] = [r for r in caplog.records if r.getMessage().startswith("reserved CPUs")]
    assert line.levelno == logging.WARNING and "some of them only" in line.getMessage() and not line.saved
    assert again.status()["reserved_cpus"] == "0-1"  # deduced: not the saved 1,3


def _token_changed(state: Path, root: Path, hook: BalloonsHook) -> None:
    doc = json.loads((state / "balloons.json").read_text())
    (state / "balloons.json").write_text(json.dumps({**doc, "token": "another"}))


def _a_cpu_offline(state: Path, root: Path, hook: BalloonsHook) -> None:
    """One of a's balloon's CPUs, not a reserved one, offline before the restart."""
    a = hook.state.pool.balloon_of(("a", "app"))
    set_online(root, format_cpuset(hook.state.topology.all_cpus - {max(a.cpus)}))


REFUSED = {
    # Before, each kept the saved set (the override), or (config) lost why the balloons were refused.
    "every container of a new pod uid": ({"renew": True}, "nor could the saved balloons keep it: the saved balloons "
                                                         "do not put back kube-system/pod-dns/app"),
    "the config changed": ({"restart": {**TWO_RESERVED, "balloonTypes": [{**WORK, "maxCPUs": 3}]}},
                           "nor could the saved balloons keep it: the saved balloons in {state} was saved under another config"),
    "a token not the reserved set's": ({"tamper": _token_changed},
                                       "nor could the saved balloons keep it: the saved balloons in {state} were not written with"),
    "a saved CPU offline": ({"tamper": _a_cpu_offline}, "nor could the saved balloons keep it: the saved balloons in {state} names CPUs"),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_saved_balloons_that_do_not_put_back_the_containers_off_the_set_leave_it_deduced(
        tmp_path: Path, caplog, case: str) -> None:
    """The move half done as above, but the saved balloons cannot vouch for
    the saved set: they do not hold dns (a stale or copied stateDir: every
    pod uid new), or do not fit the restart (another config, not written
    with reserved.json, a CPU of theirs offline). The reserved CPUs are
    deduced, as without them, with the warning saying why the balloons did
    not keep the set. Before, the first kept the saved set, logged "put
    back the containers found off them" while none was put back, and moved
    a, whose cpuset agreed; the others ("guards existing behaviour" but for
    the why) lost the first attempt's reason."""
    state = tmp_path / "state"
    config = {**TWO_RESERVED, "stateDir": str(state)}
    kwargs, why = REFUSED[case]
    if "restart" in kwargs:
        kwargs = {**kwargs, "restart": {**kwargs["restart"], "stateDir": str(state)}}
    _, again, _, reserved = await _restart_with_dns_half_moved(tmp_path, config, caplog, **kwargs)
    assert again.status()["reserved_cpus"] != reserved
    [line] = [r for r in caplog.records if r.getMessage().startswith("reserved CPUs")]
    assert line.levelno == logging.WARNING and not line.saved
    assert "some of them only" in line.getMessage()
    assert why.format(state=state / "balloons.json") in line.getMessage()


async def test_a_restart_reads_reserved_json_once(tmp_path: Path, caplog, monkeypatch) -> None:
    """The saved set refused, the saved balloons tried with it and refused
    (another config), the restart rebuilt from the cpusets: reserved.json is
    read once (before: three times here, up to four: by the judging, the
    override, and the balloons for its token)."""
    state = tmp_path / "state"
    config = {**TWO_RESERVED, "stateDir": str(state)}
    reads = []
    load = ReservedFile.load

    def counting(self: ReservedFile):
        reads.append(self.path)
        return load(self)

    def count_from_now(state: Path, root: Path, hook: BalloonsHook) -> None:
        monkeypatch.setattr(ReservedFile, "load", counting)

    restart = {**TWO_RESERVED, "balloonTypes": [{**WORK, "maxCPUs": 3}], "stateDir": str(state)}
    await _restart_with_dns_half_moved(tmp_path, config, caplog, restart=restart, tamper=count_from_now)
    assert reads == [state / "reserved.json"]


async def test_a_refused_override_logs_none_of_its_trial_placements(tmp_path: Path, caplog) -> None:
    """Every pod uid new: the saved balloons, tried with the saved set, would
    adopt every container as a new one; refused, none of that is logged, the
    restart's own rebuild from the cpusets alone (before: "balloon work[0]
    created" and "adopting running container ..." logged for placements that
    never happened)."""
    state = tmp_path / "state"
    await _restart_with_dns_half_moved(tmp_path, {**TWO_RESERVED, "stateDir": str(state)}, caplog, renew=True)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if m.startswith("adopting running container") or m.endswith(" created")]
    assert len([m for m in messages if m.startswith("restoring container")]) == 2


def _leftover(state: Path, root: Path, hook: BalloonsHook) -> None:
    """A killed hook's temporary balloons file (statefile.temp_glob)."""
    (state / ".balloons.json.killed.tmp").write_text("{")


async def test_a_refused_trial_still_logs_the_temporary_file_it_removed(tmp_path: Path, caplog) -> None:
    """Every pod uid new (the trial refused), a killed hook's temporary
    balloons file left: it is removed and that is logged (before: the whole
    trial held back, reading the file too, and its line dropped with the
    trial's though the file was gone)."""
    state = tmp_path / "state"
    await _restart_with_dns_half_moved(tmp_path, {**TWO_RESERVED, "stateDir": str(state)}, caplog, renew=True,
                                       tamper=_leftover)
    assert not (state / ".balloons.json.killed.tmp").exists()
    [line] = [r for r in caplog.records if r.getMessage() == "balloons removed a temporary state file a stopped hook left"]
    assert line.path == str(state / ".balloons.json.killed.tmp")


async def test_a_kept_trial_logs_its_placements(tmp_path: Path, caplog) -> None:
    """The saved set kept through the saved balloons: the trial's lines,
    held back while it ran, are logged once (dns, restored into its saved
    balloon): a replay not done would lose them."""
    state = tmp_path / "state"
    await _restart_with_dns_half_moved(tmp_path, {**TWO_RESERVED, "stateDir": str(state)}, caplog)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if m.startswith("restoring container kube-system/pod-dns/app")]) == 1


def test_held_lines_are_replayed_on_a_failure_and_other_threads_pass(caplog) -> None:
    """savedstart._held: a line of another thread is not held (it is not the
    trial's), and those held are logged when the trial raises (before: all
    threads' lines held, and a failure dropped the trial's)."""
    import threading

    from hooks.balloons.savedstart import _held

    logger = logging.getLogger("hooks.balloons")
    with caplog.at_level(logging.INFO, logger="hooks.balloons"), pytest.raises(RuntimeError):
        with _held(logger):
            other = threading.Thread(target=logger.info, args=("from another thread",))
            other.start()
            other.join()
            assert [r.getMessage() for r in caplog.records] == ["from another thread"]
            logger.info("the trial's")
            raise RuntimeError("failed")
    assert [r.getMessage() for r in caplog.records] == ["from another thread", "the trial's"]
