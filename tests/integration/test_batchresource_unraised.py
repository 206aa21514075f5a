"""batchresource's reconcile pass under a pod whose raise the real kernel
refuses: cgroup v1 refuses (EINVAL) a cpu.cfs_quota_us above a limited
parent's, so with the pod's parent (the test's own ``rp-batch-*/besteffort``,
made for this pod, never kubelet's shared QoS cgroup) bound below the pod's
target, the pod's quota cannot be raised, neither by the pass nor by the
hook call (PreCreateContainer) that raises the pod first. In the pass, its container's values that need
no raise of the pod are put back all the same, its quota waits, both
said; values read where they land, in /sys/fs/cgroup. Real containerd, the
hook a process behind the proxy (its listing tells the pass the container's
id)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from hooks.batchresource.reconcile import CONTAINER_RESTORED, CONTAINERS_WAIT, POD_FAILED, POD_RESTORED

from grpc import StatusCode, aio

from runtimeproxy.host.crispec import container_config

from ..hookprocs import registered
from ..prerequisites import fail_or_skip
from .batchhelpers import CGROUP_ROOT, HookRun, LogLine, PodCgroup, batchresource_hook
from .crihelpers import V1, cgroup_of
from .proxyfixtures import ProxyLauncher
from .test_batchresource import BE, MIB, Pod, batch, container_values, pod, pod_values, spec, start_container
from .test_hooks_real import container_pid

BE_VALUES = (512, 50000, 128 * MIB)  # the container's, and its pod's (one container)
BOUND = 20000  # the QoS cgroup's quota (per 100000): below the pod's 50000
LOWERED = 10000  # the container's by hand, within BOUND (the kernel's floor is 1000)
QUOTA = "cpu.cfs_quota_us"
POD_UNWRITTEN = "batchresource could not write the pod cgroup"  # a hook call's (pods.KnownPods.write_pod)
ANSWERED = "batchresource container values"


@pytest.fixture(autouse=True)
def cgroup_v1_cpu() -> None:
    """The refusal is v1's: v2 takes a child's cpu.max above its parent's (a skip elsewhere, a failure in CI)."""
    if not (CGROUP_ROOT / "cpu" / QUOTA).is_file():
        fail_or_skip("needs cgroup v1's cpu hierarchy at /sys/fs/cgroup/cpu (CFS bandwidth)")


def bound_the_pod(cgroup: PodCgroup, container: Path | None) -> Path:
    """The container's quota (if any) to LOWERED, the pod's to BOUND, then the pod's parent
    limited to BOUND (each write within what the kernel takes: a child never
    above its parent); the parent's directory. A pass of the hook (each
    200 ms) may raise one back between the writes, making the kernel refuse
    the next: the three are written again until the parent's lands. The
    caller lifts the bound (-1) in a ``finally``."""
    parent = cgroup.path("cpu").parent
    # the test's own rp-batch-*/besteffort, made with the pod: bounding a shared one would limit the host
    assert parent.resolve() in {made.resolve() for made in cgroup.created}
    for _ in range(50):
        try:
            if container is not None:
                (container / QUOTA).write_text(str(LOWERED))
            cgroup.write("cpu", QUOTA, BOUND)
            (parent / QUOTA).write_text(str(BOUND))
            return parent
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    raise AssertionError("the hook raised the pod back each time before its parent could be bound")


def refused_by_the_kernel(cgroup: PodCgroup) -> None:
    """The premise: the pod's raise to its 50000 is refused (EINVAL) by the kernel itself."""
    with pytest.raises(OSError) as refused:
        cgroup.write("cpu", QUOTA, BE_VALUES[1])
    assert refused.value.errno == errno.EINVAL
    assert cgroup.value("cpu", QUOTA) == BOUND


def of_pod(hook: HookRun, pod_name: str, message: str) -> list[LogLine]:
    return [line for line in hook.lines if line.get("msg") == message and line.get("pod") == pod_name]


async def test_a_refused_pod_raise_leaves_its_containers_values_put_back_but_the_raise(
    cri_channel, launcher: ProxyLauncher, pod_log_dir
) -> None:
    """Guards existing behaviour (test_reconcile_unraised.py in the unit tests
    fakes the refusal), here refused by the kernel. The pod's quota bound at
    20000 by its parent (the test's own rp-batch-*/besteffort; its 50000
    refused for real), its shares at 2, its container's shares at 2, quota at
    10000, memory limit at 64Mi: the pod's shares (written before the
    refusal) and the container's shares and memory limit (raised within the
    pod's 128Mi) are put back; the container's quota, above the pod's,
    waits; the refusal is warned of once, the wait said once, across every
    pass of the bound; once the bound is lifted the pod is raised, then its
    container."""
    running, _ = await launcher.start()  # (first: the hook lists pods through it)
    async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                  runtime_endpoint=str(launcher.socket)) as hook:
        await registered(running, 1)
        main = spec(main=batch("500", "128Mi"))
        async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, main) as p:
            cid, pid = await start_container(channel, p, "main")
            cpu, memory = cgroup_of(pid, "cpu"), cgroup_of(pid, "memory")
            assert cpu.parent == p.cgroup.path("cpu")
            assert (container_values(pid), pod_values(p.cgroup)) == (BE_VALUES, BE_VALUES)
            pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
            cgroup = p.cgroup.parent.lstrip("/")

            async def logged(message: str, file: str, found: int, start: int) -> LogLine:
                """The pod's line ``message`` of ``file`` found at ``found``, among those logged from ``start`` on."""
                return await hook.logged(lambda line: line.get("msg") == message and line.get("pod") == pod_name
                                         and line.get("file") == file and line.get("found") == found,
                                         timeout=20.0, start=start)

            earlier = len(hook.lines)
            bound = bound_the_pod(p.cgroup, cpu)
            try:
                refused_by_the_kernel(p.cgroup)
                p.cgroup.write("cpu", "cpu.shares", 2)
                (cpu / "cpu.shares").write_text("2")
                (memory / "memory.limit_in_bytes").write_text(str(64 * MIB))

                line = await logged(POD_RESTORED, "cpu.shares", 2, earlier)  # (raised before the quota, refused)
                assert (line["cgroup"], line["wanted"]) == (cgroup, 512)
                line = await hook.logged(lambda line: line.get("msg") == POD_FAILED and line.get("pod") == pod_name)
                assert (line["level"], line["uid"], line["cgroup"]) == ("warning", p.config.metadata.uid, cgroup)
                assert "Invalid argument" in line["reason"]  # the kernel's EINVAL
                for file, found, wanted in (("cpu.shares", 2, 512), ("memory.limit_in_bytes", 64 * MIB, 128 * MIB)):
                    line = await logged(CONTAINER_RESTORED, file, found, earlier)
                    assert (line["container"], line["container_id"], line["wanted"]) == ("main", cid, wanted)
                line = await hook.logged(lambda line: line.get("msg") == CONTAINERS_WAIT and line.get("pod") == pod_name)
                assert (line["level"], line["cgroup"], line["containers"]) == ("info", cgroup, {"main": ["cpu_quota"]})
                held = ((512, LOWERED, 128 * MIB), (512, BOUND, 128 * MIB))  # the container's and the pod's
                assert (container_values(pid), pod_values(p.cgroup)) == held

                (cpu / "cpu.shares").write_text("3")  # put back by a later pass, still refused
                await logged(CONTAINER_RESTORED, "cpu.shares", 3, earlier)
                assert (container_values(pid), pod_values(p.cgroup)) == held
                lifted = len(hook.lines)  # (a pass during bound_the_pod may have raised the quotas back)
            finally:  # the bound lifted (so also when the test fails): the pod raised, then its container
                (bound / QUOTA).write_text("-1")
            await logged(POD_RESTORED, QUOTA, BOUND, lifted)
            # every pass of the bound has logged by now (the lift's says neither): each said once across them
            assert [line["level"] for line in of_pod(hook, pod_name, POD_FAILED)] == ["warning"]
            assert len(of_pod(hook, pod_name, CONTAINERS_WAIT)) == 1
            line = await logged(CONTAINER_RESTORED, QUOTA, LOWERED, lifted)
            assert (line["container_id"], line["wanted"]) == (cid, 50000)
            assert (container_values(pid), pod_values(p.cgroup)) == (BE_VALUES, BE_VALUES)



async def create_main(channel: aio.Channel, p: Pod, attempt: int) -> str:
    """Container ``main`` of ``p`` created through the proxy (so its PreCreateContainer), attempt ``attempt``."""
    rt, pb = V1.runtime(channel), V1.pb
    config = container_config(pb, name="main")
    config.metadata.attempt = attempt
    request = pb.CreateContainerRequest(pod_sandbox_id=p.id, config=config, sandbox_config=p.config)
    return (await rt.CreateContainer(request, timeout=60)).container_id


async def test_a_pod_raise_refused_at_create_is_warned_of_and_the_runtime_refuses_the_answer(
    cri_channel, launcher: ProxyLauncher, pod_log_dir
) -> None:
    """Guards existing behaviour (server.py's _container, pods.KnownPods.write_pod),
    refused by the kernel. The pod's quota bound at 20000 by its parent before
    its container is made: PreCreateContainer's raise of the pod to 50000 is
    refused (EINVAL), warned of (``could not write the pod cgroup``), and the
    hook answers the container's batch values all the same (it never fails a
    pod); the runtime applies them, and runc's write of the container's 50000
    under the pod's 20000 is refused too: StartContainer fails (StartError), no
    container cgroup is left, the pod cgroup stays at the bound. Once the bound
    is lifted the reconcile pass raises the pod, and kubelet's next attempt of
    the container starts with its batch values."""
    running, _ = await launcher.start()  # (first: the hook lists pods through it)
    async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                  runtime_endpoint=str(launcher.socket)) as hook:
        await registered(running, 1)
        main = spec(main=batch("500", "128Mi"))
        async with launcher.channel() as channel, pod(channel, cri_channel, pod_log_dir, BE, main) as p:
            rt, pb = V1.runtime(channel), V1.pb
            assert pod_values(p.cgroup) == BE_VALUES
            pod_name = f"{p.config.metadata.namespace}/{p.config.metadata.name}"
            bound = bound_the_pod(p.cgroup, None)
            try:
                refused_by_the_kernel(p.cgroup)
                earlier = len(hook.lines)
                cid = await create_main(channel, p, 0)
                line = await hook.logged(lambda line: line.get("msg") == POD_UNWRITTEN and line.get("pod") == pod_name,
                                         start=earlier)
                assert (line["level"], line["cgroup_parent"]) == ("warning", p.cgroup.parent)
                assert "Invalid argument" in line["reason"]  # the kernel's EINVAL
                line = await hook.logged(lambda line: line.get("msg") == ANSWERED and line.get("pod") == pod_name,
                                         start=earlier)
                assert (line["container"], line["hook"]) == ("main", "PreCreateContainer")
                assert (line["cpu_shares"], line["cpu_quota"], line["memory_limit"]) == BE_VALUES

                with pytest.raises(aio.AioRpcError) as failed:  # runc writes the answer's quota: refused under the pod's
                    await rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
                assert failed.value.code() == StatusCode.UNKNOWN
                assert QUOTA in (failed.value.details() or "") and "50000" in (failed.value.details() or "")
                status = (await rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10)).status
                assert (status.state, status.reason) == (pb.CONTAINER_EXITED, "StartError")
                assert not (p.cgroup.path("cpu") / cid).exists()  # (runc removed the cgroup it made)
                assert pod_values(p.cgroup) == (512, BOUND, 128 * MIB)
                lifted = len(hook.lines)
            finally:  # the bound lifted (so also when the test fails)
                (bound / QUOTA).write_text("-1")
            line = await hook.logged(lambda line: line.get("msg") == POD_RESTORED and line.get("pod") == pod_name
                                     and line.get("file") == QUOTA and line.get("found") == BOUND,
                                     timeout=20.0, start=lifted)
            assert line["wanted"] == 50000
            assert pod_values(p.cgroup) == BE_VALUES
            retried = await create_main(channel, p, 1)  # kubelet's next attempt, as after a StartError
            await rt.StartContainer(pb.StartContainerRequest(container_id=retried), timeout=60)
            pid = await container_pid(V1, channel, retried)
            assert cgroup_of(pid, "cpu").parent == p.cgroup.path("cpu")
            assert (container_values(pid), pod_values(p.cgroup)) == (BE_VALUES, BE_VALUES)
