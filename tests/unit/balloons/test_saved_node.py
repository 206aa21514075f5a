"""The stateDir files name the node that wrote them (its machine id,
nodeid.py; docs/hook-balloons.md, Reserved CPUs kept): a restart on
another node, its stateDir copied whole (a golden image, a restored
backup: same hardware, same config, so the token, fingerprint and CPUs all
match), refuses them and deduces, as when they are missing. Machines as in
test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1; the scenario of
test_saved_reserved: CPU 0 offline and back, 3 reserved since, which the
deduction cannot tell (it reserves 0 again).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from hooks.balloons.nodeid import Node, read_node
from hooks.balloons.savedplan import PlanFile, SavedPlan, SavedPlanError
from hooks.balloons.savedreserved import ReservedFile, SavedReserved, SavedReservedError
from hooks.balloons.server import BalloonsHook

from .test_hotplug import balloons, hook_on_sysfs
from .test_replan import restarted
from .test_saved_balloons import SPLIT, _split_pod
from .test_restart_reserved import cpu_0_offline_and_back
from .test_saved_reserved import ALONE, written

A = "0123456789abcdef0123456789abcdef"
B = "fedcba9876543210fedcba9876543210"
FILES = ("reserved.json", "balloons.json")


def machine_id(tmp_path: Path, name: str, text: str | None) -> Path:
    """A machine-id file holding ``text`` (None: none there)."""
    path = tmp_path / f"machine-id-{name}"
    if text is not None:
        path.write_text(text)
    return path


def nodes_in(state: Path) -> list[str | None]:
    """The node each file names (None: no node key)."""
    return [json.loads((state / name).read_text()).get("node") for name in FILES]


async def written_on_a(tmp_path: Path) -> tuple[BalloonsHook, Path, Path, dict[str, Any]]:
    """The hook on node A, its stateDir written: 3 reserved, which what runs does not tell."""
    state = tmp_path / "state"
    config = {**ALONE, "stateDir": str(state)}
    hook, root = await cpu_0_offline_and_back(tmp_path, config, [("a", "apps"), ("b", "apps")],
                                              machine_id_path=machine_id(tmp_path, "a", A + "\n"))
    await written(hook)
    assert hook.status()["reserved_cpus"] == "3"
    return hook, root, state, config


def start_lines(caplog: pytest.LogCaptureFixture) -> dict[str, logging.LogRecord]:
    """The restart's two lines, by what they are of."""
    return {what: record for record in caplog.records for what in ("reserved CPUs", "balloons")
            if record.getMessage().startswith(f"{what} ") and " at start: " in record.getMessage()}


async def test_files_written_on_a_node_name_it_and_are_used_there(tmp_path: Path, caplog) -> None:
    """Before: the files named no node (the restart on A kept them as now)."""
    hook, root, state, config = await written_on_a(tmp_path)
    assert nodes_in(state) == [A, A]
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again, runtime = await restarted(hook, tmp_path, root, config, machine_id_path=tmp_path / "machine-id-a")
    assert (again.status()["reserved_cpus"], runtime.updates, balloons(again)) == ("3", [], balloons(hook))
    lines = start_lines(caplog)
    assert lines["reserved CPUs"].getMessage() == f"reserved CPUs 3 at start: the saved set in {state / 'reserved.json'}"
    assert lines["balloons"].getMessage() == f"balloons at start: the saved balloons in {state / 'balloons.json'}"
    assert {r.levelno for r in lines.values()} == {logging.INFO}


async def test_files_copied_to_another_node_are_refused_with_both_ids_and_the_set_deduced(tmp_path: Path, caplog) -> None:
    """The stateDir copied to node B, the same machine and config: before,
    B kept A's reserved CPU 3 and A's balloons (every other check passes)."""
    hook, root, state, config = await written_on_a(tmp_path)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again, runtime = await restarted(hook, tmp_path, root, config, machine_id_path=machine_id(tmp_path, "b", B + "\n"))
    assert again.status()["reserved_cpus"] == "0"  # deduced: the first start's pick, as with no file
    assert runtime.updates == []  # the balloons' containers were where the deduction puts them: see the next test
    lines = start_lines(caplog)
    refused = f"was written on the node of machine id {A}, this node's is {B}: a stateDir carried over from another node"
    assert lines["reserved CPUs"].getMessage().startswith(
        f"reserved CPUs 0 at start: deduced from the CPUs the containers run on: the saved set in "
        f"{state / 'reserved.json'} {refused}")
    assert lines["balloons"].getMessage().startswith(
        f"balloons at start: rebuilt from the CPUs the containers run on: the saved balloons in "
        f"{state / 'balloons.json'} {refused}")
    assert {r.levelno for r in lines.values()} == {logging.WARNING}
    await written(again)  # B's own files, in place of A's
    assert nodes_in(state) == [B, B]
    assert json.loads((state / "reserved.json").read_text())["reserved_cpus"] == "0"


async def test_balloons_copied_to_another_node_are_not_used_and_the_containers_move_as_deduced(tmp_path: Path) -> None:
    """Guards existing behaviour (fails with foreign() answering None: A's
    balloons kept, nothing moved). Pod a split over two balloons
    (test_saved_balloons), which only the saved balloons keep: on node B
    the restart regroups it as without a stateDir, both its containers
    moved: nothing saved on A was used."""
    config = {**SPLIT, "stateDir": str(tmp_path / "state")}
    hook, root = await _split_pod(tmp_path, config, machine_id_path=machine_id(tmp_path, "a", A + "\n"))
    await written(hook)
    split = [("reserved[0]", "0", []), ("work[0]", "1", ["a-one"]), ("work[1]", "3", ["a-two"])]
    assert balloons(hook) == split
    again, runtime = await restarted(hook, tmp_path, root, config, machine_id_path=machine_id(tmp_path, "b", B + "\n"))
    assert balloons(again) == [("reserved[0]", "0", []), ("work[0]", "1,3", ["a-one", "a-two"])]
    assert len(runtime.updates) == 2


async def test_files_of_an_older_hook_naming_no_node_are_used_on_any_node(tmp_path: Path) -> None:
    """Guards existing behaviour: a file without the node key (written
    before it was added) is trusted, as before; its other checks stand."""
    hook, root, state, config = await written_on_a(tmp_path)
    for name in FILES:
        doc = json.loads((state / name).read_text())
        del doc["node"]
        (state / name).write_text(json.dumps(doc))
    again, runtime = await restarted(hook, tmp_path, root, config, machine_id_path=machine_id(tmp_path, "b", B))
    assert (again.status()["reserved_cpus"], runtime.updates, balloons(again)) == ("3", [], balloons(hook))


@pytest.mark.parametrize(("text", "why"), [(None, "cannot be read"), ("", "is empty"), ("\n", "is empty"),
                                           ("uninitialized\n", "is uninitialized"), ("0" * 32 + "\n", "is uninitialized (the null id)"),
                                           ("node-1\n", "holds no machine id")],
                         ids=["missing", "empty", "a newline", "uninitialized", "null", "not a machine id"])
async def test_without_a_machine_id_no_node_is_checked_nor_written(tmp_path: Path, caplog, text: str | None,
                                                                 why: str) -> None:
    """Before: no machine_id_path (a TypeError); no node was ever checked.
    A's files are used where no machine id tells this node from A, and
    those written then name no node."""
    hook, root, state, config = await written_on_a(tmp_path)
    path = machine_id(tmp_path, "none", text)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        again, runtime = await restarted(hook, tmp_path, root, config, machine_id_path=path)
    assert (again.status()["reserved_cpus"], runtime.updates, balloons(again)) == ("3", [], balloons(hook))
    [line] = [r for r in caplog.records if r.getMessage().startswith(str(path))]
    assert line.levelno == logging.INFO
    assert line.getMessage().startswith(f"{path} {why}")
    assert "a restart does not check which node wrote them" in line.getMessage()
    await written(again)  # both written again from the start-up rebuild on
    assert nodes_in(state) == [None, None]


def no_node_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "the stateDir files are written naming no node" in r.getMessage()]


async def reload(hook: BalloonsHook, tmp_path: Path, config: dict[str, Any]) -> None:
    """``hook`` takes ``config`` by a reload, and writes what it noted."""
    path = tmp_path / "balloons.yaml"
    path.write_text(yaml.safe_dump(config))
    assert await hook.reload(path)
    await written(hook)


async def test_no_machine_id_is_said_once_a_state_dir_is_in_use(tmp_path: Path, caplog) -> None:
    """stateDir off: nothing said, the line would be noise on every node
    without a machine id. A reload turning it on says it, once, at its
    first write; later writes do not (before: said whenever the hook was
    built, stateDir or not)."""
    path = machine_id(tmp_path, "none", "")
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        hook, _, _ = await hook_on_sysfs(tmp_path, ALONE, machine_id_path=path)
        await written(hook)
        assert no_node_lines(caplog) == []
        state = tmp_path / "state"
        await reload(hook, tmp_path, {**ALONE, "stateDir": str(state)})
        await reload(hook, tmp_path, {**ALONE, "stateDir": str(tmp_path / "moved")})
    [line] = no_node_lines(caplog)
    assert (line.levelno, line.getMessage().split(":")[0]) == (logging.INFO, f"{path} is empty")
    assert nodes_in(tmp_path / "moved") == [None, None]


async def test_a_reload_turning_the_state_dir_on_writes_the_node(tmp_path: Path, caplog) -> None:
    """Guards existing behaviour: the files a reload has written name the
    node as those of a hook started with stateDir; nothing said of a
    machine id there is."""
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        hook, _, _ = await hook_on_sysfs(tmp_path, ALONE, machine_id_path=machine_id(tmp_path, "a", A + "\n"))
        await reload(hook, tmp_path, {**ALONE, "stateDir": str(tmp_path / "state")})
    assert nodes_in(tmp_path / "state") == [A, A]
    assert no_node_lines(caplog) == []


def test_read_node_takes_the_machine_id_alone(tmp_path: Path) -> None:
    path = machine_id(tmp_path, "a", A + "\n")
    assert read_node(path) == Node(A, "", str(path))
    for name, text in (("upper", A.upper() + "\n"), ("long", A * 100)):  # machine-id(5): lowercase, 32 digits
        path = machine_id(tmp_path, name, text)
        assert read_node(path) == Node("", f"{path} holds no machine id", str(path))


@pytest.mark.parametrize("file_class", [ReservedFile, PlanFile])
def test_each_file_is_refused_from_another_node_or_with_a_node_not_a_string(tmp_path: Path, file_class: type) -> None:
    """Before: the node was not read (each file was loaded)."""
    error = SavedReservedError if file_class is ReservedFile else SavedPlanError
    saved = SavedReserved(frozenset({1}), "fp", "t") if file_class is ReservedFile else SavedPlan(frozenset({1}), "fp", ())
    file_class(tmp_path, A).save(saved)
    assert file_class(tmp_path, A).load() == saved
    assert file_class(tmp_path, "").load() == saved  # no machine id here: not checked
    with pytest.raises(error, match=f"^was written on the node of machine id {A}, this node's is {B}: "):
        file_class(tmp_path, B).load()
    path = tmp_path / file_class(tmp_path).path.name
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "node": 7}))
    with pytest.raises(error, match="^has a node not a string$"):
        file_class(tmp_path, A).load()
