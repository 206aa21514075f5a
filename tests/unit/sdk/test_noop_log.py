"""The noop built-in hook logs one line per call at debug: the SDK's
(hooks.calllog), with its hook point, pod and container.

Before: its own "answered no change" line too, so each call showed twice
under `hook run noop --log-level debug`.
"""

from __future__ import annotations

import logging

import pytest

from hooks.noop import NoopHook
from hooks.routes import answer
from runtimeproxy.hookpath.points import HookType
from tests.hookrequests import container_request, pod_request


async def test_each_call_is_one_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, as hook run --log-level debug
    hook = NoopHook.from_config("/tmp/never-started.sock", {})
    await answer(hook, HookType.PRE_CREATE_CONTAINER, container_request())
    await answer(hook, HookType.PRE_RUN_POD_SANDBOX, pod_request())
    lines = [(r.name, r.levelno, r.getMessage().split(" in ")[0], getattr(r, "pod", None),
              getattr(r, "container", None)) for r in caplog.records]
    assert lines == [
        ("hooks.sdk", logging.DEBUG, "PreCreateContainer hook call answered", "default/nginx", "web"),
        ("hooks.sdk", logging.DEBUG, "PreRunPodSandbox hook call answered", "default/nginx", None),
    ]
