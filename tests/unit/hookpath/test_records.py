"""store.pod_record / container_record: the hook requests a call's record is
built as, copied as wire bytes where the CRI and hook messages agree."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor

from cri_api.hookapi import api_pb2 as hookapi
from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.merge import env_map
from runtimeproxy.hookpath.store import container_record, pod_record


def _fields(descriptor: Descriptor) -> dict[int, tuple[str, int, bool, str | None]]:
    return {
        f.number: (f.name, f.type, f.is_repeated, f.message_type.name if f.message_type else None)
        for f in descriptor.fields
    }


@pytest.mark.parametrize(
    ("cri", "hook"),
    [
        (v1.LinuxContainerResources, hookapi.LinuxContainerResources),
        (v1.HugepageLimit, hookapi.HugepageLimit),
        (v1.PodSandboxMetadata, hookapi.PodSandboxMetadata),
    ],
)
def test_messages_copied_as_wire_bytes_have_the_same_fields(cri: type, hook: type) -> None:
    # copy_as_wire relies on it: a field renumbered in either schema would
    # land in the wrong place (or be dropped) silently.
    assert _fields(cri.DESCRIPTOR) == _fields(hook.DESCRIPTOR)


def _resources(base: int) -> v1.LinuxContainerResources:
    return v1.LinuxContainerResources(
        cpu_period=base, cpu_quota=base + 1, cpu_shares=base + 2, memory_limit_in_bytes=base + 3,
        oom_score_adj=-base, memory_swap_limit_in_bytes=base + 4, cpuset_cpus="0-1", cpuset_mems="0",
        hugepage_limits=[v1.HugepageLimit(page_size="2MB", limit=base + 5)], unified={"pids.max": str(base)},
    )


def _hook_resources(resources: v1.LinuxContainerResources) -> hookapi.LinuxContainerResources:
    """Field by field: what the wire copy must equal."""
    return hookapi.LinuxContainerResources(
        cpu_period=resources.cpu_period, cpu_quota=resources.cpu_quota, cpu_shares=resources.cpu_shares,
        memory_limit_in_bytes=resources.memory_limit_in_bytes, oom_score_adj=resources.oom_score_adj,
        memory_swap_limit_in_bytes=resources.memory_swap_limit_in_bytes, cpuset_cpus=resources.cpuset_cpus,
        cpuset_mems=resources.cpuset_mems,
        hugepage_limits=[hookapi.HugepageLimit(page_size=h.page_size, limit=h.limit) for h in resources.hugepage_limits],
        unified=dict(resources.unified),
    )


def _pod_config() -> v1.PodSandboxConfig:
    return v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name="web", uid="u-1", namespace="ns", attempt=2),
        hostname="h", labels={"app": "web"}, annotations={"a": "1"},
        linux=v1.LinuxPodSandboxConfig(cgroup_parent="/kubepods/pod-u-1", overhead=_resources(10), resources=_resources(20)),
    )


def test_a_pod_record_carries_every_field_the_hook_api_has() -> None:
    config = _pod_config()
    assert pod_record(config, "runc") == hookapi.PodSandboxHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="web", uid="u-1", namespace="ns", attempt=2),
        runtime_handler="runc", labels={"app": "web"}, annotations={"a": "1"}, cgroup_parent="/kubepods/pod-u-1",
        overhead=_hook_resources(config.linux.overhead), resources=_hook_resources(config.linux.resources),
    )


def test_an_empty_config_still_gives_a_record_with_its_parts_present() -> None:
    record = pod_record(v1.PodSandboxConfig())
    assert all(record.HasField(name) for name in ("pod_meta", "overhead", "resources"))
    container = container_record(record, v1.ContainerConfig())
    assert all(container.HasField(name) for name in ("pod_meta", "container_meta", "container_resources", "pod_resources"))


def test_fields_the_hook_api_does_not_know_are_dropped() -> None:
    config = _pod_config()
    # A newer kubelet's field (number 99) in the pod's metadata and resources.
    unknown = b"\x9a\x06\x03new"
    config.metadata.MergeFromString(unknown)
    config.linux.resources.MergeFromString(unknown)
    ctr = v1.ContainerConfig(linux=v1.LinuxContainerConfig(resources=_resources(30)))
    ctr.linux.resources.MergeFromString(unknown)
    record = pod_record(config)
    assert record == pod_record(_pod_config())
    assert b"new" not in record.SerializeToString()
    assert b"new" not in container_record(record, ctr).SerializeToString()


def test_a_container_record_joins_the_container_and_its_pod() -> None:
    pod = pod_record(_pod_config(), "runc")
    config = v1.ContainerConfig(
        metadata=v1.ContainerMetadata(name="app", attempt=1), annotations={"c": "2"},
        envs=[v1.KeyValue(key="A", value=b"x"), v1.KeyValue(key="B", value=b"\xff")],
        linux=v1.LinuxContainerConfig(resources=_resources(30)),
    )
    assert container_record(pod, config, "ctr-1") == hookapi.ContainerResourceHookRequest(
        pod_meta=pod.pod_meta, container_meta=hookapi.ContainerMetadata(name="app", attempt=1, id="ctr-1"),
        container_annotations={"c": "2"}, container_resources=_hook_resources(config.linux.resources),
        pod_resources=pod.resources, pod_annotations={"a": "1"}, pod_labels={"app": "web"},
        pod_cgroup_parent="/kubepods/pod-u-1", container_envs=env_map(config.envs),
    )
