"""The saved reserved set's writer and directory (hooks/balloons/savedset.py,
docs/hook-balloons.md, Reserved CPUs kept): written off the event loop, the
latest set last, a failure logged once; the file in a stateDir a reload
leaves removed; a restart reads the stateDir it started with. Machines as in
test_hotplug: CPUs 0-3 on NUMA node 0, 4-7 on node 1.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import threading
from pathlib import Path

import yaml

from hooks import statefile
from hooks.balloons.balloon import Member
from hooks.balloons.config import parse_config
from hooks.balloons.planning import Restored
from hooks.balloons.savedreserved import ReservedFile, SavedReserved
from hooks.balloons.savedset import SavedSet
from hooks.balloons.server import BalloonsHook

from .test_hotplug import hook_on_sysfs, set_online
from .test_replan import running
from .test_restart_reserved import cpu_0_offline_and_back
from .test_saved_reserved import ALONE, saved_in, written
from .test_server import FakeRuntime, request

WAIT = 10.0  # seconds a test thread waits for the test at most: a failure, not a hang


async def test_a_failed_write_whose_error_names_a_random_temporary_file_is_logged_once(tmp_path: Path, monkeypatch, caplog) -> None:
    """mkstemp's error names the file it tried, another each time: logged
    once per set and (errno, strerror) (before: str(exc) compared, a
    warning every reconcile pass)."""
    state = tmp_path / "state"
    hook, _, root = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(state)})
    names = itertools.count()

    def full(**_: object) -> tuple[int, str]:
        raise OSError(errno.ENOSPC, "No space left on device", str(state / f".reserved.json.{next(names)}.tmp"))

    monkeypatch.setattr(statefile.tempfile, "mkstemp", full)
    set_online(root, "1-7")  # reserved 1 since: a set to save
    with caplog.at_level(logging.WARNING, logger="hooks.balloons"):
        for _ in range(3):
            await hook.reconcile()
            await written(hook)
    assert next(names) == 3  # tried at every pass
    [warning] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cannot save")]
    assert warning.startswith(f"cannot save the reserved CPUs 1 and the balloons in {state}: writing reserved.json failed")
    assert "No space left on device" in warning


async def test_a_set_noted_while_a_write_runs_is_written_after_it(tmp_path: Path, monkeypatch) -> None:
    """Three sets noted, the first being written: the last lands last, the
    one between never written."""
    config = parse_config({**ALONE, "stateDir": str(tmp_path)})
    started, release = threading.Event(), threading.Event()
    saves: list[frozenset[int]] = []
    real = ReservedFile.save

    def slow(self: ReservedFile, saved: SavedReserved) -> None:
        saves.append(saved.cpus)
        if len(saves) == 1:
            started.set()
            assert release.wait(WAIT)
        real(self, saved)

    monkeypatch.setattr(ReservedFile, "save", slow)
    saved = SavedSet(str(tmp_path))
    saved.record(config, frozenset({1}))
    writer = asyncio.create_task(saved.write_due())
    assert await asyncio.to_thread(started.wait, WAIT)
    saved.record(config, frozenset({2}))
    saved.record(config, frozenset({3}))
    assert not saved.settled
    release.set()
    await writer
    assert saves == [frozenset({1}), frozenset({3})]
    assert saved_in(tmp_path)["reserved_cpus"] == "3" and saved.settled


async def test_a_hook_call_does_not_wait_for_a_slow_write(tmp_path: Path, monkeypatch) -> None:
    """A hotplug noticed at PreCreateContainer changes the reserved CPUs:
    the call notes them and answers while the writer's write of the set
    before is stuck (before: the hook call wrote, fsync-ed, on the event
    loop). At the hook's stop, the latest set is written."""
    state = tmp_path / "state"
    hook, _, root = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(state)})
    await written(hook)
    writing, release = threading.Event(), threading.Event()
    stuck_too_long = []
    real = ReservedFile.save

    def stuck(self: ReservedFile, saved: SavedReserved) -> None:
        if not writing.is_set():
            writing.set()
            if not release.wait(WAIT):
                stuck_too_long.append(saved.cpus)
        real(self, saved)

    monkeypatch.setattr(ReservedFile, "save", stuck)
    set_online(root, "1-7")
    await hook.pre_create_container(request("a", "app", ns="apps", shares=1024))
    assert not writing.is_set()  # noted for the writer, not written by the call
    writer = asyncio.create_task(hook._saved.run())
    assert await asyncio.to_thread(writing.wait, WAIT)  # the writer is stuck on reserved 1
    set_online(root, "0,2-7")
    answer = await hook.pre_create_container(request("b", "app", ns="apps", shares=1024))
    assert answer is not None and not release.is_set() and stuck_too_long == []
    assert hook.status()["reserved_cpus"] != "1"
    release.set()
    await hook._saved.finish(timeout=WAIT)  # the hook's stop (HookServer._before_release; its 2 s bound, a slow disk's fsyncs could exceed)
    await asyncio.wait_for(writer, WAIT)  # ends with it
    assert saved_in(state)["reserved_cpus"] == hook.status()["reserved_cpus"]


async def test_a_restart_reads_the_state_dir_it_started_with_though_a_reload_before_its_rebuild_moved_it(
    tmp_path: Path, caplog
) -> None:
    """Reserved 3 saved in old (CPU 0 went offline and back); the restarted
    hook's config is reloaded with stateDir new before its rebuild: it keeps
    3, read from old, saves it in new and removes old's (before: it read new,
    empty, and deduced 0)."""
    old, new = tmp_path / "old", tmp_path / "new"
    pods = [("a", "apps"), ("b", "apps")]
    hook, root = await cpu_0_offline_and_back(tmp_path, {**ALONE, "stateDir": str(old)}, pods)
    await written(hook)
    assert saved_in(old)["reserved_cpus"] == "3"
    runtime = FakeRuntime()
    runtime.live = running(hook)
    again = BalloonsHook(str(tmp_path / "again.sock"), parse_config({**ALONE, "stateDir": str(old)}), sysfs_root=root, runtime=runtime)
    config_file = tmp_path / "balloons.yaml"
    config_file.write_text(yaml.safe_dump({**ALONE, "stateDir": str(new)}))
    assert await again.reload(config_file)
    with caplog.at_level(logging.INFO, logger="hooks.balloons"):
        await again.rebuild()
        await written(again)
    assert again.status()["reserved_cpus"] == "3"
    assert f"reserved CPUs 3 at start: the saved set in {old / 'reserved.json'}" in caplog.text
    assert saved_in(new)["reserved_cpus"] == "3" and list(old.iterdir()) == []


async def test_a_start_naming_a_state_dir_a_reload_left_deduces(tmp_path: Path) -> None:
    """stateDir moved away and back by reloads, with a hotplug between: the
    file left in the first was removed, so the restart naming it deduces or
    reads what this hook wrote there since, never the set it left (before:
    it kept reserved 0, one hotplug behind)."""
    first, other = tmp_path / "first", tmp_path / "other"
    config_file = tmp_path / "balloons.yaml"
    hook, _, root = await hook_on_sysfs(tmp_path, {**ALONE, "stateDir": str(first)})
    await written(hook)
    assert saved_in(first)["reserved_cpus"] == "0"
    config_file.write_text(yaml.safe_dump({**ALONE, "stateDir": str(other)}))
    assert await hook.reload(config_file)
    await written(hook)
    set_online(root, "1-7")
    await hook.reconcile()
    await written(hook)
    assert (saved_in(other)["reserved_cpus"], list(first.iterdir())) == ("1", [])
    kept = SavedSet(str(first)).at_start.restart(parse_config(ALONE), hook.state.topology, running_restored(hook))[0]
    assert kept.reserved is None and "none saved in" in kept.why


def running_restored(hook: BalloonsHook) -> list[Restored]:
    """What ``hook``'s containers run on, as a restart finds them."""
    return [Restored(Member(f.key, f.pod.namespace, f.pod.pod_name, 0, f.container_id), f.pod, f.cpus, f.mems)
            for f in running(hook)]
