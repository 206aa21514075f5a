"""What the saved-set writer writes, and when (hooks/balloons/savedset.py,
docs/hook-balloons.md, Restarts and Reserved CPUs kept): every hook call
notes the balloons; an unchanged reserved set is not written again; after a
failed write hook calls do not write, the reconcile pass retries; the
balloons are used only with the reserved.json written with them (a token
both files carry). Machines as in test_hotplug: CPUs 0-3 on NUMA node 0,
4-7 on node 1.
"""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

from hooks.balloons import savedset
from hooks.balloons.savedplan import PlanFile, SavedPlan, snapshot
from hooks.balloons.savedreserved import ReservedFile, SavedReserved
from hooks.balloons.server import BalloonsHook

from .test_hotplug import hook_on_sysfs, set_online
from .test_replan import restarted
from .test_saved_balloons import SPLIT, _split_pod
from .test_saved_reserved import saved_in, written
from .test_server import request


def _noted(hook: BalloonsHook) -> SavedPlan | None:
    wanted = hook._saved._wanted
    assert wanted is not None
    return wanted.plan


async def test_each_hook_call_that_may_change_a_balloon_notes_the_balloons(tmp_path: Path) -> None:
    """After each of the five hook calls the balloons noted for the writer
    are those the hook runs on (before: the _save() calls in PreCreate,
    PreStart and PreUpdate could go and no test saw it)."""
    hook, _, _ = await hook_on_sysfs(tmp_path, {**SPLIT, "stateDir": str(tmp_path / "state")})
    calls = [
        hook.pre_create_container(request("a", "one", shares=1024)),
        hook.pre_start_container(request("b", "one", shares=1024, cid="b-one")),  # created unseen: placed at start
        hook.pre_update_container_resources(request("c", "one", shares=1024, cid="c-one")),  # unseen: placed
        hook.post_stop_container(request("a", "one")),
        hook.post_stop_pod_sandbox(request("b", "one")),
    ]
    for call in calls:
        before = _noted(hook)
        await call
        assert _noted(hook) == snapshot(hook.state) != before


async def test_an_unchanged_reserved_set_is_not_written_again(tmp_path: Path, monkeypatch) -> None:
    """Hook calls change the balloons, not the reserved CPUs: balloons.json
    alone is written, with the token of the reserved.json there (before:
    reserved.json rewritten and fsync-ed at every one)."""
    state = tmp_path / "state"
    hook, _, _ = await hook_on_sysfs(tmp_path, {**SPLIT, "stateDir": str(state)})
    await written(hook)
    saves = []
    real = ReservedFile.save

    def counted(self: ReservedFile, saved: SavedReserved) -> None:
        saves.append(saved.cpus)
        real(self, saved)

    monkeypatch.setattr(ReservedFile, "save", counted)
    token = json.loads((state / "reserved.json").read_text())["token"]
    for uid in "abc":
        await hook.pre_create_container(request(uid, "one", shares=1024))
        await written(hook)
    assert saves == []
    plan = json.loads((state / "balloons.json").read_text())
    assert plan["token"] == token and sum(len(b["members"]) for b in plan["balloons"]) == 3


async def test_after_a_failed_write_hook_calls_do_not_write_the_reconcile_pass_retries(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """balloons.json cannot be written: the warning names it, both files go;
    ten hook calls after make no write (before: each tried, fsyncs and all);
    each reconcile pass tries the latest noted; once a write succeeds the
    recovery is logged (before: the set logged before the failure was not
    logged again) and the files hold the latest balloons."""
    state = tmp_path / "state"
    hook, _, _ = await hook_on_sysfs(tmp_path, {**SPLIT, "stateDir": str(state)})
    await written(hook)
    tries = 0
    real = PlanFile.save

    def full(self: PlanFile, plan: SavedPlan) -> None:
        nonlocal tries
        tries += 1
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PlanFile, "save", full)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await hook.pre_create_container(request("a", "one", shares=1024))
        await written(hook)
        assert tries == 1 and list(state.iterdir()) == []
        for n in range(10):
            await hook.pre_create_container(request("a", f"c{n}", shares=100))
            await written(hook)
        assert tries == 1
        await hook.reconcile()
        await written(hook)
        assert tries == 2
        monkeypatch.setattr(PlanFile, "save", real)
        caplog.clear()
        await hook.reconcile()
        await written(hook)
    [warning] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("cannot save", "reserved CPUs"))]
    assert warning == f"reserved CPUs 0 saved to {state / 'reserved.json'}"
    plan = json.loads((state / "balloons.json").read_text())
    assert sum(len(b["members"]) for b in plan["balloons"]) == 11
    assert plan["token"] == json.loads((state / "reserved.json").read_text())["token"]


async def test_the_failure_warning_names_the_file_that_failed(tmp_path: Path, monkeypatch, caplog) -> None:
    state = tmp_path / "state"
    hook, _, _ = await hook_on_sysfs(tmp_path, {**SPLIT, "stateDir": str(state)})
    await written(hook)

    def full(self: PlanFile, plan: SavedPlan) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PlanFile, "save", full)
    with caplog.at_level(logging.WARNING, logger="hooks.balloons"):
        await hook.pre_create_container(request("a", "one", shares=1024))
        await written(hook)
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning == (f"cannot save the reserved CPUs 0 and the balloons in {state}: writing balloons.json failed: "
                       "[Errno 28] No space left on device; both files removed, retried at every reconcile pass")


async def _restart_reason(hook: BalloonsHook, tmp_path: Path, root: Path, config: dict, caplog) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await restarted(hook, tmp_path, root, config)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("balloons at start")]
    return line


async def test_balloons_not_written_with_the_reserved_json_there_are_not_used(tmp_path: Path, caplog) -> None:
    """An older hook ran on the stateDir (a downgrade, then an upgrade): it
    rewrote reserved.json, without a token, and left balloons.json as it
    was, which agrees with what runs, though the older hook may have
    changed the balloons since (before: trusted); the same with
    reserved.json gone and the reserved CPUs listed (before: used)."""
    state = tmp_path / "state"
    config = {**SPLIT, "stateDir": str(state)}
    hook, root = await _split_pod(tmp_path, config)
    await written(hook)
    assert await _restart_reason(hook, tmp_path, root, config, caplog) == \
        f"balloons at start: the saved balloons in {state / 'balloons.json'}"
    older = saved_in(state)  # as an older hook writes it: no token
    (state / "reserved.json").write_text(json.dumps(older))
    line = await _restart_reason(hook, tmp_path, root, config, caplog)
    assert line.endswith(f"balloons.json were not written with {state / 'reserved.json'} (a crash between the two "
                         "writes, or a hook of an earlier version ran since)"), line
    listed = {**config, "reservedResources": {"cpu": "cpuset:0"}}
    (state / "reserved.json").unlink()
    line = await _restart_reason(hook, tmp_path, root, listed, caplog)
    assert "were not written with" in line, line


async def test_a_crash_between_the_two_writes_leaves_balloons_a_restart_does_not_use(tmp_path: Path, caplog) -> None:
    """reserved.json written, the hook killed before balloons.json was: the
    older balloons.json is not used (its token, and its reserved CPUs,
    differ). Guards the crash-between-writes case, which the reserved CPUs
    alone caught before too."""
    state = tmp_path / "state"
    config = {**SPLIT, "stateDir": str(state)}
    hook, root = await _split_pod(tmp_path, config)
    await written(hook)
    before = (state / "balloons.json").read_bytes()
    set_online(root, "1-7")  # reserved 1 since
    await hook.reconcile()
    await written(hook)
    (state / "balloons.json").write_bytes(before)  # as if killed between the two writes
    line = await _restart_reason(hook, tmp_path, root, config, caplog)
    assert line.startswith("balloons at start: rebuilt from the CPUs the containers run on"), line


async def test_hook_calls_do_not_fingerprint_the_config_again(tmp_path: Path, monkeypatch) -> None:
    """The config is fingerprinted once, not twice per hook call (before: ~64 µs a call)."""
    hook, _, _ = await hook_on_sysfs(tmp_path, {**SPLIT, "stateDir": str(tmp_path / "state")})
    await hook.pre_create_container(request("a", "one", shares=1024))
    calls = 0
    real = savedset.fingerprint

    def counted(config: object) -> str:
        nonlocal calls
        calls += 1
        return real(config)

    monkeypatch.setattr(savedset, "fingerprint", counted)
    monkeypatch.setattr("hooks.balloons.savedplan.fingerprint", counted)
    for uid in "bcd":
        await hook.pre_create_container(request(uid, "one", shares=1024))
    assert calls == 0


async def test_a_state_dir_left_and_named_again_gets_its_reserved_json_back(tmp_path: Path) -> None:
    """stateDir a, cleared by a reload, then a again with the same set: the
    files removed on leaving are both written again (before: the writer
    still took reserved.json for on disk, wrote balloons.json alone, and a
    restart found no reserved.json and refused the balloons' token)."""
    from hooks.balloons.config import parse_config
    from hooks.balloons.savedset import SavedSet

    from .test_saved_reserved import ALONE

    state = tmp_path / "state"
    with_dir = parse_config({**ALONE, "stateDir": str(state)})
    without = parse_config(ALONE)
    saved = SavedSet(str(state))
    for config in (with_dir, without, with_dir):
        saved.record(config, frozenset({1}))
        await saved.write_due()
    assert saved_in(state)["reserved_cpus"] == "1"
