"""NRI's ClampedRegistry is a HookSource: the dispatcher reads its snapshot
(has_servers) and is told of changes with the configs it calls, clamped.

Before: it had no snapshot (Dispatcher.has_servers raised AttributeError
under NRI, where no path reached it yet), and its change callbacks got the
registry's unclamped configs, unequal to the ones the dispatcher called.
"""

from __future__ import annotations

from pathlib import Path

from hooks.registration import write_hook_config
from runtimeproxy.hookpath.dispatch import Dispatcher
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.registry import HookRegistry, HookSnapshot, HookSource
from runtimeproxy.nri.limits import ClampedRegistry


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
