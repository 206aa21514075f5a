"""A real kubelet runs static pods through the proxy, checked as an operator would.

The tests of one variant share one running node (see conftest.py) and build
on each other in file order: pods running, their cgroups, what the hooks saw,
a manifest removed, kubelet's error log, then a proxy restart.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from . import runtime
from .cgroups import cgroup_of, read_value
from .conftest import VARIANTS, DirectRun, ProxiedNode
from .crierrors import cri_errors
from .kubelet import read_sysctls
from .manifests import (
    BATCH,
    BATCH_CFS_QUOTA_US,
    BATCH_MEMORY_BYTES,
    CFS_PERIOD_US,
    CFS_QUOTA_US,
    DOOMED,
    LIMITED,
    MEMORY_LIMIT_BYTES,
    MULTI,
    NAMESPACE,
    PODS,
    PROBED,
    StaticPod,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
log = logging.getLogger(__name__)

KUBELET_TIMEOUT = 60.0  # kubelet's own status lags the runtime by a sync or two
RECOVERY_TIMEOUT = 30.0  # "within seconds", on a loaded shared machine
LIVE_PODS = tuple(p for p in PODS if p is not DOOMED)


def _kubelet_pods(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["metadata"]["name"]: item for item in items}


def _statuses(item: dict[str, Any], key: str = "containerStatuses") -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in item.get("status", {}).get(key, [])}


async def _kubelet_sees_running(node: ProxiedNode, pods: tuple[StaticPod, ...]) -> dict[str, dict[str, Any]]:
    """Until kubelet's own status has every pod Running with all its containers running."""
    async def running() -> dict[str, dict[str, Any]] | None:
        items = _kubelet_pods(await node.run.kubelet.pods())
        for pod in pods:
            item = items.get(node.run.pod_name(pod))
            if item is None or item.get("status", {}).get("phase") != "Running":
                return None
            statuses = _statuses(item)
            if set(statuses) != set(pod.containers) or not all("running" in s["state"] for s in statuses.values()):
                return None
        return items

    return await runtime.wait_for("kubelet reports every pod Running", running, KUBELET_TIMEOUT)


async def test_static_pods_reach_running(proxied_node: ProxiedNode) -> None:
    node = proxied_node
    await node.run.wait_running()
    running_s = asyncio.get_running_loop().time() - node.run.started_at
    items = await _kubelet_sees_running(node, LIVE_PODS + (DOOMED,))
    init = _statuses(items[node.run.pod_name(MULTI)], "initContainerStatuses")["init"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert all(s["restartCount"] == 0 for item in items.values() for s in _statuses(item).values())
    log.info("pods running %.1f s after their manifests were written", running_s,
             extra={"variant": node.variant, "seconds": round(running_s, 1)})


async def test_kubelet_speaks_v1_and_the_proxy_translates_as_configured(node: ProxiedNode) -> None:
    assert "Validated CRI v1 runtime API" in node.run.kubelet.log_text()
    assert "Validated CRI v1 image API" in node.run.kubelet.log_text()
    translated = [r["msg"] for r in node.proxy.log_records() if "translated" in r.get("msg", "")]
    assert bool(translated) == ("--backend-version" in VARIANTS[node.variant]), translated


async def test_proxy_serves_kubelet_on_the_variants_data_path(node: ProxiedNode) -> None:
    """On frames the proxy's grpc server moves to a private socket behind the frames listener
    (runtimeproxy/frames/path.py): a variant whose flag were ignored would fail here."""
    sockets = node.proxy.listening_sockets()
    assert str(node.proxy.socket) in sockets, sockets
    private = {s for s in sockets if Path(s).parent.name.startswith("runtime-proxy-frames-")}
    flags = VARIANTS[node.variant]
    assert len(private) == (flags[flags.index("--data-path") + 1] == "frames"), sockets


async def test_host_sysctls_are_untouched(node: ProxiedNode, host_sysctls: dict[str, str]) -> None:
    """kubelet set its kernel tunables in its own mount namespace only."""
    assert read_sysctls() == host_sysctls


async def test_liveness_probe_runs_through_the_proxy(node: ProxiedNode) -> None:
    kubelet = node.run.kubelet

    async def probes_succeeded() -> bool:
        total, failed = await kubelet.runtime_operations()
        return total.get("exec_sync", 0) - failed.get("exec_sync", 0) >= 2

    await runtime.wait_for("two successful ExecSync probes", probes_succeeded, KUBELET_TIMEOUT)
    probed = _statuses(_kubelet_pods(await kubelet.pods())[node.run.pod_name(PROBED)])["main"]
    assert probed["restartCount"] == 0 and "running" in probed["state"]


async def test_limited_container_gets_kubelets_cgroup_values(node: ProxiedNode) -> None:
    async with node.run.channel() as channel:
        pod = (await runtime.pods(channel))[node.run.pod_name(LIMITED)]
        pid = await runtime.container_pid(channel, pod.containers["main"].id)
    # Guaranteed QoS: kubelet puts the pod straight under kubepods, below our cgroupRoot.
    pod_cgroup = f"{node.run.cgroups.parent}/kubepods/pod{pod.uid}"
    cgroups = node.run.cgroups
    for controller in ("cpu", "memory"):
        assert cgroup_of(pid, controller).startswith(pod_cgroup + "/"), (controller, cgroup_of(pid, controller))
    container_cpu, pod_cpu = cgroups.path("cpu", cgroup_of(pid, "cpu")), cgroups.path("cpu", pod_cgroup)
    container_mem, pod_mem = cgroups.path("memory", cgroup_of(pid, "memory")), cgroups.path("memory", pod_cgroup)
    for directory in (container_cpu, pod_cpu):
        assert read_value(directory / "cpu.cfs_quota_us") == CFS_QUOTA_US, directory
        assert read_value(directory / "cpu.cfs_period_us") == CFS_PERIOD_US, directory
    for directory in (container_mem, pod_mem):
        assert read_value(directory / "memory.limit_in_bytes") == MEMORY_LIMIT_BYTES, directory


async def test_test_hook_server_sees_kubelets_requests(node: ProxiedNode) -> None:
    run = node.run
    sandboxes = {r["pod_meta"]["name"]: r for r in node.recorder.requests("PreRunPodSandbox")}
    creates = {(r["pod_meta"]["name"], r["container_meta"]["name"]): r
               for r in node.recorder.requests("PreCreateContainer")}
    starts = {(r["pod_meta"]["name"], r["container_meta"]["name"])
              for r in node.recorder.requests("PostStartContainer")}
    for pod in PODS:
        name = run.pod_name(pod)
        request = sandboxes[name]
        uid = request["pod_meta"]["uid"]
        assert request["pod_meta"]["namespace"] == NAMESPACE
        assert request["labels"]["io.kubernetes.pod.name"] == name
        assert request["labels"]["io.kubernetes.pod.namespace"] == NAMESPACE
        assert request["labels"]["io.kubernetes.pod.uid"] == uid
        assert request["annotations"]["kubernetes.io/config.source"] == "file"
        qos = "" if pod is LIMITED else "besteffort/"
        assert request["cgroup_parent"] == f"{run.cgroups.parent}/kubepods/{qos}pod{uid}"
        for container in pod.init_containers + pod.containers:
            create = creates[(name, container)]
            assert create["pod_meta"]["uid"] == uid
            assert create["pod_cgroup_parent"] == request["cgroup_parent"]
            assert create["container_annotations"]["io.kubernetes.container.hash"]
            assert (name, container) in starts
    limited = creates[(run.pod_name(LIMITED), "main")]["container_resources"]
    assert int(limited["cpu_quota"]) == CFS_QUOTA_US and int(limited["memory_limit_in_bytes"]) == MEMORY_LIMIT_BYTES


async def test_builtin_batchresource_hook_applies_batch_resources(node: ProxiedNode) -> None:
    """The built-in hook found the BE pod by kubelet's labels and annotations and wrote
    its cgroup at kubelet's cgroup parent, below our cgroupRoot."""
    async with node.run.channel() as channel:
        pod = (await runtime.pods(channel))[node.run.pod_name(BATCH)]
        pid = await runtime.container_pid(channel, pod.containers["main"].id)
    cgroups = node.run.cgroups
    pod_cgroup = f"{cgroups.parent}/kubepods/besteffort/pod{pod.uid}"
    for directory in (cgroups.path("cpu", cgroup_of(pid, "cpu")), cgroups.path("cpu", pod_cgroup)):
        assert read_value(directory / "cpu.cfs_quota_us") == BATCH_CFS_QUOTA_US, directory
    for directory in (cgroups.path("memory", cgroup_of(pid, "memory")), cgroups.path("memory", pod_cgroup)):
        assert read_value(directory / "memory.limit_in_bytes") == BATCH_MEMORY_BYTES, directory


async def test_removed_manifest_stops_its_pod(node: ProxiedNode) -> None:
    seconds = await node.run.remove(DOOMED)
    name = node.run.pod_name(DOOMED)

    async def forgotten() -> bool:
        return name not in _kubelet_pods(await node.run.kubelet.pods())

    await runtime.wait_for(f"kubelet forgets {name}", forgotten, KUBELET_TIMEOUT)
    stops = {r["pod_meta"]["name"] for r in node.recorder.requests("PostStopPodSandbox")}
    assert name in stops
    await _kubelet_sees_running(node, LIVE_PODS)  # the others are untouched
    log.info("removed pod stopped %.1f s after its manifest went", seconds,
             extra={"variant": node.variant, "seconds": round(seconds, 1)})


async def test_kubelet_logs_no_cri_error_a_direct_run_does_not(node: ProxiedNode, direct_run: DirectRun) -> None:
    proxied = cri_errors(node.run.kubelet.log_text())
    extra = sorted(proxied - direct_run.errors)
    assert not extra, "CRI errors only through the proxy:\n" + "\n".join(map(str, extra))


async def test_proxy_restart_leaves_every_container_running(node: ProxiedNode) -> None:
    run, kubelet = node.run, node.run.kubelet
    loop = asyncio.get_running_loop()
    async with run.channel() as channel:
        before = await runtime.pods(channel)
        items = await _kubelet_sees_running(node, LIVE_PODS)
        counts = {(pod, c): s["restartCount"] for pod, item in items.items() for c, s in _statuses(item).items()}
        failed_before = sum((await kubelet.runtime_operations())[1].values())

        await node.proxy.restart()
        back = loop.time()
        total, failed = await kubelet.runtime_operations()
        ok_at_back = {op: total[op] - failed.get(op, 0) for op in total}

        async def succeeded_again() -> dict[str, float] | None:
            total, failed = await kubelet.runtime_operations()
            ok = {op: total[op] - failed.get(op, 0) for op in total}
            return ok if ok["list_podsandbox"] > ok_at_back["list_podsandbox"] else None

        await runtime.wait_for("kubelet's calls succeed again", succeeded_again, RECOVERY_TIMEOUT)
        recovered_s = loop.time() - back

        async def settled() -> dict[str, float] | None:
            # A few relists and a probe after recovery: kubelet has looked at every container again.
            total, failed = await kubelet.runtime_operations()
            ok = {op: total[op] - failed.get(op, 0) for op in total}
            done = (ok["list_podsandbox"] >= ok_at_back["list_podsandbox"] + 3
                    and ok["exec_sync"] > ok_at_back.get("exec_sync", 0))
            return ok if done else None

        await runtime.wait_for("kubelet relisted and probed after the restart", settled, RECOVERY_TIMEOUT)
        after = await runtime.pods(channel)
        items = await _kubelet_sees_running(node, LIVE_PODS)
    live = {run.pod_name(p) for p in LIVE_PODS}
    assert {n: p for n, p in after.items() if n in live} == {n: p for n, p in before.items() if n in live}
    assert {(pod, c): s["restartCount"] for pod, item in items.items() for c, s in _statuses(item).items()} == counts
    rebuilt = [r for r in node.proxy.log_records() if r.get("msg") == "state rebuilt from backend"]
    assert len(rebuilt) == 1 and rebuilt[0]["pods_skipped"] == rebuilt[0]["containers_skipped"] == 0, rebuilt
    assert rebuilt[0]["pods"] >= len(LIVE_PODS)
    failed_calls = sum((await kubelet.runtime_operations())[1].values()) - failed_before
    log.info("proxy restarted under kubelet: its calls succeed again %.1f s after the proxy serves, "
             "%d kubelet calls failed", recovered_s, failed_calls,
             extra={"variant": node.variant, "calls_ok_again_after_s": round(recovered_s, 1),
                    "failed_kubelet_calls": failed_calls})


async def test_restarted_proxy_logs_no_warning(node: ProxiedNode) -> None:
    """A proxy restarted under kubelet's pods: an operator reading its log finds nothing amiss."""
    if node.proxy.starts < 2:  # run alone, without the restart test before it
        await node.proxy.restart()
    noisy = [r for r in node.proxy.log_records() if r.get("level") in ("warning", "error", "critical")]
    assert not noisy, noisy
