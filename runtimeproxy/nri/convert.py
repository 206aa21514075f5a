"""NRI objects as the CRI requests the hook path reads, and the hook path's
merged requests back as NRI adjustments and updates.

The hook path (executors, merge rules, store) works on CRI v1 requests; an
NRI event is turned into the CRI request the runtime is carrying out, run
through it unchanged, and what the hooks changed is read back as a diff.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cri_api.nri import api_pb2 as nri
from cri_api.v1 import api_pb2 as v1

log = logging.getLogger(__name__)


def cri_resources(resources: nri.LinuxResources) -> v1.LinuxContainerResources:
    cpu, memory = resources.cpu, resources.memory
    # containerd sets the swap limit to the memory limit whenever kubelet sets
    # none (kubelet's request has 0): shown to hooks as kubelet sent it, or a
    # hook that raises the memory limit would be refused for a swap below it.
    swap = memory.swap.value
    if swap and swap == memory.limit.value:
        swap = 0
    out = v1.LinuxContainerResources(
        cpu_period=cpu.period.value,
        cpu_quota=cpu.quota.value,
        cpu_shares=cpu.shares.value,
        cpuset_cpus=cpu.cpus,
        cpuset_mems=cpu.mems,
        memory_limit_in_bytes=memory.limit.value,
        memory_swap_limit_in_bytes=swap,
    )
    for limit in resources.hugepage_limits:
        out.hugepage_limits.add(page_size=limit.page_size, limit=limit.limit)
    out.unified.update(resources.unified)
    return out


# containerd's own bookkeeping labels on the sandbox ("io.cri-containerd.kind"):
# not the pod's, and never seen by hooks behind the proxy.
RUNTIME_LABEL_PREFIX = "io.cri-containerd."


def pod_config(pod: nri.PodSandbox) -> v1.PodSandboxConfig:
    config = v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace),
        labels={k: v for k, v in pod.labels.items() if not k.startswith(RUNTIME_LABEL_PREFIX)},
        annotations=dict(pod.annotations),
    )
    config.linux.cgroup_parent = pod.linux.cgroup_parent
    config.linux.overhead.CopyFrom(cri_resources(pod.linux.pod_overhead))
    config.linux.resources.CopyFrom(cri_resources(pod.linux.pod_resources))
    return config


def run_pod_request(pod: nri.PodSandbox) -> v1.RunPodSandboxRequest:
    return v1.RunPodSandboxRequest(config=pod_config(pod), runtime_handler=pod.runtime_handler)


# kubelet puts the container's restart count, the attempt of its CRI
# ContainerMetadata, in this annotation of every container it creates
# (kuberuntime's newContainerAnnotations); NRI's Container has no attempt.
RESTART_COUNT_ANNOTATION = "io.kubernetes.container.restartCount"


def container_attempt(container: nri.Container) -> int:
    """The attempt kubelet gave the container, as hooks behind the CRI proxy
    see it; 0 when the annotation is missing or garbled (not made by kubelet,
    which writes plain decimal digits: int() would also take "+3", " 3",
    "3_0" or other scripts' digits)."""
    text = container.annotations.get(RESTART_COUNT_ANNOTATION)
    if text is None:
        return 0
    attempt = int(text) if text.isascii() and text.isdigit() else -1
    if not 0 <= attempt < 2**32:  # (ContainerMetadata.attempt is a uint32)
        log.debug("NRI container's restart count annotation is not a count; attempt 0 told to hooks",
                  extra={"container": container.name, "container_id": container.id,
                         "pod_sandbox_id": container.pod_sandbox_id,
                         "annotation": RESTART_COUNT_ANNOTATION, "value": text})
        return 0
    return attempt


def container_config(container: nri.Container) -> v1.ContainerConfig:
    config = v1.ContainerConfig(
        metadata=v1.ContainerMetadata(name=container.name, attempt=container_attempt(container)),
        annotations=dict(container.annotations),
    )
    for entry in container.env:
        key, _, value = entry.partition("=")
        config.envs.add(key=key, value=value.encode())
    config.linux.resources.CopyFrom(cri_resources(container.linux.resources))
    if container.linux.HasField("oom_score_adj"):  # kubelet's, as hooks see it behind the CRI proxy
        config.linux.resources.oom_score_adj = container.linux.oom_score_adj.value
    return config


def create_request(pod: nri.PodSandbox, container: nri.Container) -> v1.CreateContainerRequest:
    return v1.CreateContainerRequest(
        pod_sandbox_id=pod.id, config=container_config(container), sandbox_config=pod_config(pod)
    )


def update_request(container: nri.Container, resources: nri.LinuxResources) -> v1.UpdateContainerResourcesRequest:
    return v1.UpdateContainerResourcesRequest(container_id=container.id, linux=cri_resources(resources))


@dataclass
class Diff:
    """The resources hooks changed, as an NRI partial resources message."""

    resources: nri.LinuxResources = field(default_factory=nri.LinuxResources)
    changed: bool = False


def resources_diff(before: v1.LinuxContainerResources, after: v1.LinuxContainerResources) -> Diff:
    diff = Diff()
    out = diff.resources

    def changed(name: str) -> bool:
        if getattr(before, name) == getattr(after, name):
            return False
        diff.changed = True
        return True

    if changed("cpu_shares"):
        out.cpu.shares.value = after.cpu_shares
    if changed("cpu_quota"):
        out.cpu.quota.value = after.cpu_quota
    if changed("cpu_period"):
        out.cpu.period.value = after.cpu_period
    if changed("cpuset_cpus"):
        out.cpu.cpus = after.cpuset_cpus
    if changed("cpuset_mems"):
        out.cpu.mems = after.cpuset_mems
    if changed("memory_limit_in_bytes"):
        out.memory.limit.value = after.memory_limit_in_bytes
    if changed("memory_swap_limit_in_bytes"):
        out.memory.swap.value = after.memory_swap_limit_in_bytes
    elif out.memory.HasField("limit") and not after.memory_swap_limit_in_bytes and after.memory_limit_in_bytes > 0:
        # containerd's rule for a swap kubelet left unset (see cri_resources), which an
        # update must keep: runc refuses a memory limit above the swap limit.
        out.memory.swap.value = after.memory_limit_in_bytes
    if before.hugepage_limits != after.hugepage_limits:
        diff.changed = True
        for limit in after.hugepage_limits:
            out.hugepage_limits.add(page_size=limit.page_size, limit=limit.limit)
    for key, value in after.unified.items():
        if before.unified.get(key) != value:
            out.unified[key] = value
            diff.changed = True
    return diff


def cgroups_path_under(path: str, parent: str) -> str:
    """The container's cgroups path moved under another pod cgroup parent, by
    containerd's rule (getCgroupsPath): under a parent whose last element is
    a ``.slice``, ``<that slice>:<prefix>:<id>`` (systemd: kubelet sends the
    expanded parent, ``/kubepods.slice/.../pod.slice``, and runc refuses a
    slice name with a "/"), else ``<parent>/<id>``."""
    if ":" in path:
        _, prefix, name = path.split(":", 2)
    else:
        prefix, name = "cri-containerd", path.rstrip("/").rsplit("/", 1)[-1]
    base = parent.rstrip("/").rsplit("/", 1)[-1]
    if base.endswith(".slice"):
        return f"{base}:{prefix}:{name}"
    return f"{parent.rstrip('/')}/{name}"


def container_adjustment(
    container: nri.Container, before: v1.CreateContainerRequest, after: v1.CreateContainerRequest
) -> nri.ContainerAdjustment:
    """The adjustment that makes the runtime create ``after`` instead of ``before``."""
    adjust = nri.ContainerAdjustment()
    for key, value in after.config.annotations.items():
        if before.config.annotations.get(key) != value:
            adjust.annotations[key] = value
    env_before = {kv.key: kv.value for kv in before.config.envs}
    for kv in after.config.envs:
        if env_before.get(kv.key) != kv.value:
            adjust.env.add(key=kv.key, value=kv.value.decode(errors="replace"))
    diff = resources_diff(before.config.linux.resources, after.config.linux.resources)
    if diff.changed:
        adjust.linux.resources.CopyFrom(diff.resources)
    parent = after.sandbox_config.linux.cgroup_parent
    if parent != before.sandbox_config.linux.cgroup_parent:
        adjust.linux.cgroups_path = cgroups_path_under(container.linux.cgroups_path, parent)
    return adjust


def container_update(
    before: v1.UpdateContainerResourcesRequest, after: v1.UpdateContainerResourcesRequest
) -> list[nri.ContainerUpdate]:
    diff = resources_diff(before.linux, after.linux)
    if not diff.changed:
        return []
    update = nri.ContainerUpdate(container_id=before.container_id)
    update.linux.resources.CopyFrom(diff.resources)
    return [update]
