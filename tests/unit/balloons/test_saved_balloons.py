"""The balloons saved in stateDir for a restart (docs/hook-balloons.md,
Restarts): written with the reserved CPUs by the one writer, read back as
saved, used by a restart that agrees with them (a pod split over balloons of
its type stays split, the default balloon's fallback stays there), and, when
the file is missing, damaged or no longer fits the config or the machine,
the rebuild from the cpusets as without it, logged with the reason
(containers found off them, and balloons no longer fitting the config or
the machine: test_saved_restart). Machines as in
test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from hooks.balloons import restoring
from hooks.balloons.config import parse_config
from hooks.balloons.savedplan import PlanFile, rebuild_from, snapshot
from hooks.balloons.savedset import SavedSet
from hooks.balloons.state import Assignments
from hooks.balloons.topology import Topology

from .test_churn_split_pods import run
from .test_hotplug import balloons, hook_on_sysfs
from .test_replan import restarted
from .test_restart_random import found, groups
from .test_saved_reserved import written
from .test_server import request

# maxCPUs 2 under Ignore: a's first container and b's share work[0], full, so a's second
# gets work[1]; b gone, work[0] has room for it again. Found by their
# cpusets alone, it rejoins its pod's balloon at a restart.
SPLIT = {"reservedResources": {"cpu": "1"}, "onExhausted": "Ignore", "balloonTypes": [{"name": "work", "namespaces": ["*"], "maxCPUs": 2}]}
SEED = 14  # test_churn_split_pods' seed 14: a restart from the cpusets regroups its pods


def churned(seed: int = SEED) -> tuple[dict, Topology, Assignments]:
    _, _, made = run(seed)
    assert made is not None
    return made


def test_the_saved_balloons_are_read_back_as_written(tmp_path: Path) -> None:
    _, _, state = churned()
    file = PlanFile(tmp_path)
    assert file.load() is None  # an older hook's stateDir: none
    plan = snapshot(state)
    file.save(plan)
    assert file.load() == plan
    assert [p.name for p in tmp_path.iterdir()] == ["balloons.json"]  # no temporary file left


def test_a_restart_with_the_saved_balloons_keeps_a_split_pod_split() -> None:
    """From the cpusets alone this restart regroups pods (the known gap);
    with the balloons saved it gets each balloon back, named, with its CPUs
    and containers, and moves nothing."""
    doc, topology, state = churned()
    config = parse_config(doc)
    assert groups(restoring.rebuild(config, topology, found(state)), frozenset()) != groups(state, frozenset())
    again = rebuild_from(config, topology, found(state), snapshot(state)).state
    assert [(b.name, b.cpus, sorted(b.members)) for b in again.pool.balloons] == \
        [(b.name, b.cpus, sorted(b.members)) for b in state.pool.balloons]
    assert again.pool.reserved == state.pool.reserved and again.moves() == []


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", "is not JSON"),
    ('{"version": "2", "balloons": []}', "is not a version 1 balloons file"),
    ('{"balloons": []}', "is not a version 1 balloons file"),
    ('{"version": 1, "reserved_cpus": "0", "config": "x", "balloons": [{"type": "work"}]}', "is malformed"),
    ('{"version": 1, "reserved_cpus": "0", "config": "x", "balloons": [{"type": "w", "index": 0, "cpus": "a-", '
     '"cpuset": "", "members": []}]}', "is malformed"),
])
def test_a_damaged_balloons_file_falls_back_to_the_cpusets_with_a_warning(tmp_path: Path, text: str, why: str) -> None:
    doc, topology, state = churned()
    (tmp_path / "balloons.json").write_text(text)
    at = SavedSet(str(tmp_path)).at_start.restart(parse_config(doc), topology, found(state))[1]
    assert at.state is None and at.level == logging.WARNING
    assert at.why.startswith(f"rebuilt from the CPUs the containers run on: the saved balloons in {tmp_path / 'balloons.json'} {why}")


def test_a_balloons_file_of_a_later_version_falls_back_to_the_cpusets_at_info(tmp_path: Path) -> None:
    """A newer hook wrote it, then was downgraded: expected, an info line
    (before: the warning of a damaged file)."""
    doc, topology, state = churned()
    (tmp_path / "balloons.json").write_text('{"version": 2, "balloons": []}')
    at = SavedSet(str(tmp_path)).at_start.restart(parse_config(doc), topology, found(state))[1]
    assert (at.state, at.level) == (None, logging.INFO)
    assert at.why.endswith("balloons.json is of version 2, written by a later hook (this one reads version 1)")


def test_without_a_balloons_file_a_restart_rebuilds_from_the_cpusets(tmp_path: Path) -> None:
    """Guards existing behaviour: an older hook's stateDir (reserved.json
    alone), or stateDir off."""
    doc, topology, state = churned()
    config = parse_config(doc)
    at = SavedSet(str(tmp_path)).at_start.restart(config, topology, found(state))[1]
    assert (at.state, at.level) == (None, logging.INFO) and "none saved in" in at.why
    at = SavedSet("").at_start.restart(config, topology, found(state))[1]
    assert at.state is None and at.why.endswith("(stateDir not set: not saved)")


async def _split_pod(tmp_path: Path, config: dict, **options: Any) -> tuple:
    """Pod a's two containers in balloons of their own (``options``: BalloonsHook's)."""
    hook, _, root = await hook_on_sysfs(tmp_path, config, **options)
    for uid, name in (("a", "one"), ("b", "one"), ("a", "two")):
        await hook.pre_create_container(request(uid, name, shares=1024))
        await hook.pre_start_container(request(uid, name, cid=f"{uid}-{name}"))
    await hook.post_stop_container(request("b", "one", cid="b-one"))
    assert await hook.apply_moves()
    return hook, root


async def test_a_restarted_hook_keeps_the_balloons_it_saved(tmp_path: Path, caplog) -> None:
    """End to end: the hook saves its balloons on each hook call, and the
    next one, on the same stateDir, rebuilds them as they were, logged once
    (before: as without stateDir, pod a's containers merged into work[0],
    both moved)."""
    hook, root = await _split_pod(tmp_path / "off", SPLIT)
    before = [("reserved[0]", "0", []), ("work[0]", "1", ["a-one"]), ("work[1]", "3", ["a-two"])]
    assert balloons(hook) == before
    again, runtime = await restarted(hook, tmp_path / "off", root, SPLIT)
    assert balloons(again)[1:] == [("work[0]", "1,3", ["a-one", "a-two"])] and len(runtime.updates) == 2
    state = tmp_path / "state"
    config = {**SPLIT, "stateDir": str(state)}
    hook, root = await _split_pod(tmp_path, config)
    await written(hook)
    assert balloons(hook) == before and (state / "balloons.json").exists()
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again, runtime = await restarted(hook, tmp_path, root, config)
    assert balloons(again) == balloons(hook) and runtime.updates == []
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("balloons at start")]
    assert line == f"balloons at start: the saved balloons in {state / 'balloons.json'}"
