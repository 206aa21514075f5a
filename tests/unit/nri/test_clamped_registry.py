"""NRI's ClampedRegistry is a HookSource: the dispatcher reads its snapshot
(has_servers) and is told of changes with the configs it calls, clamped.

Before: it had no snapshot (Dispatcher.has_servers raised AttributeError
under NRI, where no path reached it yet), and its change callbacks got the
registry's unclamped configs, unequal to the ones the dispatcher called.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi
from hooks.registration import write_hook_config
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry, HookSnapshot, HookSource
from runtimeproxy.nri.limits import HOOK_DEADLINE, ClampedRegistry
from tests.hookrequests import request_for
from tests.unit.hookpath.test_dispatch import Answering


def test_a_clamped_registry_is_a_hook_source_whose_snapshot_and_changes_are_clamped(tmp_path: Path) -> None:
    write_hook_config(tmp_path, "slow", "/run/slow.sock", ["PreCreateContainer"], timeout="30s")
    registry = HookRegistry(tmp_path, check_permissions=False)
    registry.reload()
    clamped = ClampedRegistry(registry, 1.5)
    assert isinstance(clamped, HookSource)
    assert [s.timeout for s in clamped.snapshot.servers.values()] == [1.5]
    assert Dispatcher(clamped).has_servers()

    told: list[HookSnapshot] = []
    clamped.on_change(told.append)
    write_hook_config(tmp_path, "quick", "/run/quick.sock", ["PreCreateContainer"], timeout="500ms")
    registry.reload()
    (snapshot,) = told
    assert snapshot is clamped.snapshot
    assert {name: s.timeout for name, s in snapshot.servers.items()} == {"quick.json": 0.5, "slow.json": 1.5}
    # The servers the dispatcher calls are the snapshot's own, by equality: what it keeps by server, it keeps.
    calling = tuple(clamped.servers_for(HookType.PRE_CREATE_CONTAINER))
    assert calling == snapshot.servers_for(HookType.PRE_CREATE_CONTAINER)
    assert snapshot.generation == registry.snapshot.generation


async def test_an_unapplied_answer_of_a_clamped_server_is_noted_once_under_an_events_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Under an event's deadline a pre hook's chain hands out its clamped
    server with the time left for a timeout, a new config at each call.
    Before: the dispatcher noted the unapplied answer by that config, so it
    logged 'hook answer not applied' at every call and kept one entry per
    call until the hook directory changed (without bound on a steady node)."""
    write_hook_config(tmp_path, "start", "/run/start.sock", ["PreStartContainer"], timeout="30s")
    registry = HookRegistry(tmp_path, check_permissions=False)
    registry.reload()
    envs = hookapi.ContainerResourceHookResponse(container_envs={"START": "1"})
    dispatcher = Dispatcher(ClampedRegistry(registry, 1.5), transport=Answering(envs))
    caplog.set_level("INFO", logger="runtimeproxy.hookpath.dispatch")
    start = HookType.PRE_START_CONTAINER
    now = asyncio.get_running_loop().time()
    for left in (1.2, 1.1):  # each call its own time left: its own copy of the config
        token = HOOK_DEADLINE.set(now + left)
        try:
            await dispatcher.run_pre(start, lambda: _request(start), lambda answer, server: False, {})
        finally:
            HOOK_DEADLINE.reset(token)
    noted = [r for r in caplog.records if r.getMessage().startswith("hook answer not applied")]
    assert [(r.hook_file, r.answer_fields) for r in noted] == [("start.json", "container_envs")]
    assert dispatcher._unapplied_noted == {(dispatcher.registry.snapshot.servers["start.json"], start)}
    await dispatcher.close()


async def _request(hook: HookType) -> Message:
    return request_for(hook)
