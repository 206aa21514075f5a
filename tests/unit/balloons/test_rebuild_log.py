"""The start-up rebuild's log line counts the live containers it was rebuilt
from as the runtime lists them: those running, and those created and not
started yet (CONTAINER_CREATED), which it places and moves too; an exited
one is not counted. A real RuntimeClient on a fake runtime's socket."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from cri_api.v1 import api_pb2 as v1
from hooks.balloons.config import parse_config
from hooks.balloons.runtime import RuntimeClient
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology

from .test_one_endpoint import OnePodRuntime
from .test_retarget import serving
from .test_server import CONFIG


class ThreeStates(OnePodRuntime):
    """Pod p's containers: "app" running, "side" created (not started), "init" exited."""

    STATES = {"app": v1.CONTAINER_RUNNING, "side": v1.CONTAINER_CREATED, "init": v1.CONTAINER_EXITED}

    async def ListContainers(self, request: v1.ListContainersRequest, context: Any) -> v1.ListContainersResponse:
        return v1.ListContainersResponse(containers=[
            v1.Container(id=f"c-{name}", pod_sandbox_id="s1", metadata=v1.ContainerMetadata(name=name), state=state)
            for name, state in self.STATES.items()])


async def test_the_rebuild_log_counts_running_and_created_containers_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "runtime.sock"
    async with serving(ThreeStates("p", "app", "c-app", 0), sock):  # type: ignore[arg-type]
        runtime = RuntimeClient(str(sock))
        hook = BalloonsHook(str(tmp_path / "b.sock"), parse_config({**CONFIG, "runtimeEndpoint": str(sock)}),
                            topology=Topology.synthetic(1, 1, 8, 1), runtime=runtime, reconcile_interval=3600)
        try:
            with caplog.at_level(logging.INFO, logger="hooks.balloons"):
                await hook.rebuild()
        finally:
            await hook.stop(0)
    assert sorted(m.container_id for _, m in hook.state.pool.members()) == ["c-app", "c-side"]
    (record,) = [r for r in caplog.records if r.getMessage().startswith("assignments rebuilt from")]
    assert record.getMessage() == "assignments rebuilt from 2 live containers (1 running, 1 created, not started yet)"
    assert (record.containers, record.running, record.not_started) == (2, 1, 1)  # type: ignore[attr-defined]
