"""batchresource's stop saves the containers recorded since the last pass
while it still holds the hook socket's lock, and writes nothing after
(BatchResourceHook._before_release): the next instance, waiting on the lock,
reads every answer, and no late write lands on its files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtimeproxy.host import socketlock

from .fakeruntime import FakePod
from .hookfixtures import POD_PARENT, container_request, pod_request
from .learnfixtures import TWO, hook_with_learner, kubelet_be_cgroups
from .specs import BE

STATE = Path("state") / "uid-1.json"


async def test_the_answers_since_the_last_pass_are_saved_before_the_lock_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: saved after HookServer.stop had let the lock go, so a new
    instance could read the file without the last answers (then overwrite
    those containers, logged as untold)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    hook, _ = hook_with_learner(tmp_path)
    await hook.start()
    await hook.pre_run_pod_sandbox(pod_request(BE, TWO))
    await hook.pre_create_container(container_request(BE, TWO, "main", attempt=2))
    at_release: list[object] = []
    real = socketlock.release

    def release(lock: socketlock.SocketLock | None) -> None:
        at_release.append(json.loads((tmp_path / STATE).read_text()).get("containers"))
        real(lock)

    monkeypatch.setattr(socketlock, "release", release)
    await hook.stop(0, drain=0)
    assert at_release == [[["main", 2]]]


async def test_a_pass_under_way_as_the_hook_stops_writes_no_file(tmp_path: Path) -> None:
    """The listing's loop runs until ``hook run`` cancels it, after the stop:
    a pass that was awaiting the runtime then takes up a pod in memory only
    (before: it saved the pod's file after the lock went, over the next
    instance's, or bringing back one it had removed)."""
    kubelet_be_cgroups(tmp_path / "cgroup", 1, POD_PARENT)
    pod = FakePod("p-1", "uid-1", BE, TWO)
    hook, stub = hook_with_learner(tmp_path, pod)
    await hook.start()

    async def the_hook_stops() -> None:
        await hook.stop(0, drain=0)

    stub.during["PodSandboxStatus"] = the_hook_stops
    assert hook.learner is not None
    assert await hook.learner.pass_once() == ["uid-1"]
    assert "uid-1" in hook.pods and not (tmp_path / STATE).exists()
