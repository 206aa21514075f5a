"""batchresource's reconcile pass under a pod whose raise the real kernel
refuses: cgroup v1 refuses (EINVAL) a cpu.cfs_quota_us above a limited
parent's, so with the pod's parent (the test's own ``rp-batch-*/besteffort``,
made for this pod, never kubelet's shared QoS cgroup) bound below the pod's
target, the pod's quota cannot be raised. Its container's values that need
no raise of the pod are put back all the same, its quota waits, both
said; values read where they land, in /sys/fs/cgroup. Real containerd, the
hook a process behind the proxy (its listing tells the pass the container's
id)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from hooks.batchresource.reconcile import CONTAINER_RESTORED, CONTAINERS_WAIT, POD_FAILED, POD_RESTORED

from ..hookprocs import registered
from ..prerequisites import fail_or_skip
from .batchhelpers import CGROUP_ROOT, HookRun, LogLine, PodCgroup, batchresource_hook
from .crihelpers import cgroup_of
from .proxyfixtures import ProxyLauncher
from .test_batchresource import BE, MIB, batch, container_values, pod, pod_values, spec, start_container

BE_VALUES = (512, 50000, 128 * MIB)  # the container's, and its pod's (one container)
BOUND = 20000  # the QoS cgroup's quota (per 100000): below the pod's 50000
LOWERED = 10000  # the container's by hand, within BOUND (the kernel's floor is 1000)
QUOTA = "cpu.cfs_quota_us"


@pytest.fixture(autouse=True)
def cgroup_v1_cpu() -> None:
    """The refusal is v1's: v2 takes a child's cpu.max above its parent's (a skip elsewhere, a failure in CI)."""
    if not (CGROUP_ROOT / "cpu" / QUOTA).is_file():
        fail_or_skip("needs cgroup v1's cpu hierarchy at /sys/fs/cgroup/cpu (CFS bandwidth)")


def bound_the_pod(cgroup: PodCgroup, container: Path) -> Path:
    """The container's quota to LOWERED, the pod's to BOUND, then the pod's parent
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
    async with batchresource_hook(launcher.dir, launcher.hook_dir, reconcile_interval="200ms",
                                  runtime_endpoint=str(launcher.socket)) as hook:
        running, _ = await launcher.start()
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
