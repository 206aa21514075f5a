"""A pod removed past the proxy (on containerd's own socket) leaves no record behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from runtimeproxy.hookpath.store import StateStore
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.crispec import pod_sandbox_config

from .proxyfixtures import ProxyLauncher


async def test_resync_forgets_a_pod_removed_past_the_proxy(
    containerd: LocalContainerd, launcher: ProxyLauncher, cri_channel: aio.Channel, pod_log_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct = v1_grpc.RuntimeServiceStub(cri_channel)
    config = pod_sandbox_config(v1, pod_log_dir, name="past-the-proxy")
    pod_id = (await direct.RunPodSandbox(v1.RunPodSandboxRequest(config=config), timeout=60)).pod_sandbox_id
    removed = False
    try:
        resynced: asyncio.Queue[bool] = asyncio.Queue()
        forget_unlisted = StateStore.forget_unlisted

        async def counted(store: StateStore) -> None:
            await forget_unlisted(store)
            await resynced.put(pod_id in store.pods)

        monkeypatch.setattr(StateStore, "forget_unlisted", counted)
        running, _ = await launcher.start(state_resync_interval=0.1)
        # The start-up rebuild reads the pod back (hooks of its containers need
        # it); a resync may run before the rebuild has (a loaded machine), and
        # once it has, resyncs keep it while containerd has it.
        async with asyncio.timeout(30):
            while not await resynced.get():
                pass
        assert running.store.pods[pod_id].pod_meta.uid == config.metadata.uid

        await direct.StopPodSandbox(v1.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        await direct.RemovePodSandbox(v1.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        removed = True
        async with asyncio.timeout(30):
            while await resynced.get():
                pass  # a resync that began before the removal still saw it
        assert pod_id not in running.store.pods
    finally:
        if not removed:
            await direct.StopPodSandbox(v1.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
            await direct.RemovePodSandbox(v1.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
