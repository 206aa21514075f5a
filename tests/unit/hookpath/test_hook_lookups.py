"""A hook point as a table key, looked up at every hook call (hashed by identity), works as before."""

from __future__ import annotations

import copy
import pickle

from runtimeproxy.hookpath.points import HOOK_POINTS, HookType


def test_hook_points_are_table_keys_as_before() -> None:
    for hook in HookType:
        assert HOOK_POINTS[hook].hook is hook
        assert {hook: 1}[HookType(hook.value)] == 1  # looked up by value: the same member
        assert pickle.loads(pickle.dumps(hook)) in {hook} and copy.deepcopy(hook) in frozenset({hook})
    assert len({*HookType, *HookType}) == len(HookType)
