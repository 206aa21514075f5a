"""batchresource reads its state dir, and removes a killed hook's temporary
files, only once it holds the hook socket's lock (BatchResourceHook._before_serving),
where it also reopens what a failed start's release step closed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from cri_api.hookapi import api_pb2_grpc
from hooks.errors import HookServerError
from runtimeproxy.host import socketlock
from tests.unixsockets import another_instance_serving, socket_mode_fails

from .fakecgroup import make_cgroup, read
from .hookfixtures import POD_PARENT, make_hook, pod_request
from .learnfixtures import ONE, hook_with_learner
from .specs import BE

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


async def test_a_second_instance_refused_as_the_path_is_in_use_leaves_the_live_ones_files(tmp_path: Path) -> None:
    """Before: the state dir was read, its temporary files removed, as the
    hook was built (``hook run``'s from_config), before its start claimed
    the lock: a second ``hook run`` refused as in use had already removed
    the live instance's write under way, whose rename then failed."""
    live = make_hook(tmp_path)
    await live.start()
    try:
        state = tmp_path / "state"
        state.mkdir()
        in_flight = state / ".uid-1.json.w1r2t3.tmp"  # the live instance's write, before its rename
        in_flight.write_text('{"uid": "uid-1"')
        second = make_hook(tmp_path)
        with pytest.raises(HookServerError):
            await second.start()
        assert in_flight.exists()
    finally:
        await live.stop(0, drain=0)


async def test_the_instance_that_claims_the_lock_reads_the_state_and_removes_leftovers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    record = {"uid": "uid-1", "namespace": "team-a", "name": "batch-job", "cgroup_parent": "/kubepods/besteffort/poduid-1", "spec": "{}"}
    (state / "uid-1.json").write_text(json.dumps(record))
    leftover = state / ".uid-2.json.k1ll3d.tmp"
    leftover.write_text('{"uid": "uid-2"')
    hook = make_hook(tmp_path)
    assert ("uid-1" in hook.pods, leftover.exists()) == (False, True)  # built: nothing read yet
    await hook.start()
    try:
        assert ("uid-1" in hook.pods, leftover.exists()) == (True, False)
    finally:
        await hook.stop(0, drain=0)


async def test_a_hook_whose_start_failed_after_its_release_step_starts_again_and_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lock claimed, the start fails at its listener: the release step
    closes the runtime listing and the state dir, as a stop does, under the
    lock. With the cause gone, a start again on the same object serves: a
    hook call answered over the socket and saved, the listing reopened under
    the lock reaching the runtime (before: refused as "used once", only a new
    object could serve). One that served and was stopped stays used once."""
    hook, stub = hook_with_learner(tmp_path)
    assert hook.learner is not None
    root = tmp_path / "cgroup"
    make_cgroup(root, 1, POD_PARENT)
    socket_mode_fails(monkeypatch, hook.socket_path)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await hook.start()
    assert hook.learner.lister.closed and hook.pods.closed and not hook.serving
    monkeypatch.undo()
    await asyncio.wait_for(hook.start(), WAIT)
    try:
        assert not hook.learner.lister.closed and not hook.pods.closed
        async with grpc.aio.insecure_channel(hook.target) as channel:
            answer = await api_pb2_grpc.RuntimeHookServiceStub(channel).PreRunPodSandboxHook(
                pod_request(BE, ONE), timeout=WAIT)
        assert answer.resources.cpu_shares == 512
        assert read(root, 1, POD_PARENT, "cpu.shares") == "512"
        assert (tmp_path / "state" / "uid-1.json").is_file()
        await asyncio.wait_for(hook.learner.pass_once(), WAIT)
        assert "ListPodSandbox" in stub.calls  # the listing reaches the runtime again
    finally:
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
    with pytest.raises(HookServerError, match="used once: it served and was stopped"):
        await hook.start()
    assert not hook.serving


async def test_a_hook_without_a_runtime_listing_starts_again_after_a_failed_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards existing behaviour: nothing of it is closed for good (its state dir is read again under the lock)."""
    hook = make_hook(tmp_path)
    socket_mode_fails(monkeypatch, hook.socket_path)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await hook.start()
    monkeypatch.undo()
    await hook.start()
    try:
        assert hook.serving and not hook.pods.closed
    finally:
        await hook.stop(0, drain=0)


async def test_a_start_again_refused_its_socket_leaves_closed_what_the_failed_start_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards existing behaviour: what a failed start's release step closed
    reopens only under the socket's lock (_before_serving). Another instance
    holding it, the start again is refused "in use" with the runtime listing
    and the state dir still closed; once it lets go, the start serves."""
    hook, _ = hook_with_learner(tmp_path)
    assert hook.learner is not None
    socket_mode_fails(monkeypatch, hook.socket_path)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await hook.start()
    monkeypatch.undo()
    path = Path(hook.socket_path)
    held = await asyncio.wait_for(socketlock.claim(path, wait_s=0), WAIT)
    with another_instance_serving(path, held):
        with pytest.raises(HookServerError, match="in use"):
            await asyncio.wait_for(hook.start(), WAIT)
        assert not hook.serving and hook.learner.lister.closed and hook.pods.closed
    await asyncio.wait_for(hook.start(), WAIT)
    try:
        assert hook.serving and not hook.learner.lister.closed and not hook.pods.closed
    finally:
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
