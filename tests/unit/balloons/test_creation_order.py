"""Containers found running that are placed as new ones, a restart's that
the saved balloons do not hold and reconcile's adopted, go in one order
(planning.creation_order, docs/hook-balloons.md): the order they were
created (CRI created_at), one whose creation time is not known (0) last,
ties by container id; never the runtime's listing order.

The machine and config as test_saved_restart's ONE_CPU: work[0] (maxCPUs 1)
holds p0 (600m) and has room for 400m more; two new 400m containers compete
for that room, the one placed first takes it, the other makes work[1].
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hooks.balloons.balloon import Member
from hooks.balloons.config import PodContext
from hooks.balloons.planning import Restored, creation_order
from hooks.balloons.runtime import FoundContainer, Listing
from hooks.balloons.savedplan import rebuild_from, snapshot
from hooks.balloons.server import BalloonsHook
from hooks.balloons.state import Assignments

from .test_restart_random import found
from .test_saved_restart import FOUR, ONE_CPU, _placed, running_of
from .test_server import FakeRuntime

# (uid, container id, created_at), in the runtime's listing order; the first
# to be placed is the one expected in work[0].
CASES = {
    # Before, at reconcile: listing order, d took work[0]. Ids sort the other way.
    "created first": ([("d", "id-a-d", 2_000), ("c", "id-z-c", 1_000)], "c"),
    # Before: first at a restart (0 sorted before every time) and at reconcile (listed first).
    "created_at 0 last": ([("x", "id-a-x", 0), ("c", "id-z-c", 1_000)], "c"),
    # Before, at reconcile: listing order, b took work[0]; a restart already went by id.
    "ties by id": ([("b", "id-b", 1_000), ("a", "id-a", 1_000)], "a"),
}


def _new(uid: str, cid: str) -> tuple[Member, PodContext]:
    return Member((uid, "c"), "apps", uid, 400, cid), PodContext("apps", uid, "c")


async def _at(at: str, state: Assignments, listed: list[tuple[str, str, int]], tmp_path: Path) -> Assignments:
    """``state`` after a restart from its saved balloons, or from the
    cpusets (the hook's, no stateDir), or a reconcile pass, finding the
    ``listed`` containers on every CPU besides its own."""
    every = FOUR.all_cpus
    if at == "a restart":
        new = [Restored(*_new(uid, cid), every, "0", created=created) for uid, cid, created in listed]
        return rebuild_from(state.config, FOUR, [*found(state), *new], snapshot(state)).state
    live = [FoundContainer(cid, (uid, "c"), _new(uid, cid)[1], uid, every, "0", 409, created_at=created)
            for uid, cid, created in listed]
    if at == "a restart from the cpusets":
        runtime = FakeRuntime()
        # At their requests (running_of's 1024 shares would fill work[0] with p0).
        runtime.live = [dataclasses.replace(f, shares=state.pool.balloon_of(f.key).members[f.key].milli * 1024 // 1000)
                        for f in running_of(state)] + live
        hook = BalloonsHook(str(tmp_path / "b.sock"), state.config, topology=FOUR, runtime=runtime)
        await hook.rebuild()
        return hook.state
    state.reconcile(Listing([*running_of(state), *live], []), 0.0, 0.0)
    return state


@pytest.mark.parametrize("at", ["a restart", "a restart from the cpusets", "reconcile"])
@pytest.mark.parametrize("case", list(CASES))
async def test_containers_placed_as_new_go_in_the_order_they_were_created(at: str, case: str, tmp_path: Path) -> None:
    """The one placed first joins work[0], the other makes work[1]; what
    came before each case's change is in its comment in CASES (the restart's
    "created first" and "ties by id" guard existing behaviour). A restart
    from the cpusets placed them in listing order before, each case."""
    listed, first = CASES[case]
    state = await _at(at, _placed(ONE_CPU, FOUR, ("p0", 600)), listed, tmp_path)
    other = next(uid for uid, _, _ in listed if uid != first)
    assert state.pool.balloon_of((first, "c")).name == "work[0]"
    assert state.pool.balloon_of((other, "c")).name == "work[1]"
    assert sorted(state.pool.balloon_of(("p0", "c")).members) == sorted([("p0", "c"), (first, "c")])


def test_the_order_is_one_key_for_both() -> None:
    """The key itself: by time, unknown (0) last, ties by id."""
    keys = [("u", 0), ("b", 5), ("a", 5), ("c", 1)]
    assert sorted(keys, key=lambda k: creation_order(k[1], k[0])) == [("c", 1), ("a", 5), ("b", 5), ("u", 0)]
