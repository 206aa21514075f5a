"""What a check (:func:`hooks.answercheck.check_answer`,
:func:`hooks.chaincheck.check_chain`) judges an answer against: kubelet's
call as it would show a hook the request, the node's facts, a cgroup cpuset
hierarchy as given. Shared by both checks, so they judge the same call."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from cri_api.v1 import api_pb2 as v1
from runtimeproxy.hookpath.merge import CPUSETS, copy_as_wire
from runtimeproxy.hookpath.parentcpuset import FILES, ParentCpusets
from runtimeproxy.hookpath.points import HookPoint, HookType, Kind
from runtimeproxy.hookpath.validate import NodeFacts, parse_id_list, read_node_facts

__all__ = ["cgroup_hierarchy", "kubelet_call", "node_facts"]


def kubelet_call(point: HookPoint, request: Any, call: Message | None) -> Message:
    """A copy of ``call``, else the CRI call that would show a hook
    ``request`` (store.pod_record and container_record, the other way):
    what the executor applies answers to. An update as kubelet sends a
    resize (kuberuntime's generateLinuxContainerResources): no annotations,
    no cpusets (a CPU manager's names cpuset_cpus alone)."""
    if call is not None:
        out = type(call)()
        out.CopyFrom(call)
        return out
    if point.kind is Kind.POD:
        pod = v1.RunPodSandboxRequest()
        config = pod.config
        config.labels.update(request.labels)
        config.annotations.update(request.annotations)
        config.linux.cgroup_parent = request.cgroup_parent
        copy_as_wire(config.linux.resources, request.resources)
        return pod
    resources = v1.LinuxContainerResources()
    copy_as_wire(resources, request.container_resources)
    if point.hook is HookType.PRE_UPDATE_CONTAINER_RESOURCES:
        for name in CPUSETS:
            resources.ClearField(name)
        return v1.UpdateContainerResourcesRequest(container_id=request.container_meta.id, linux=resources)
    create = v1.CreateContainerRequest()
    create.config.annotations.update(request.container_annotations)
    create.config.linux.resources.CopyFrom(resources)
    for key, value in request.container_envs.items():
        create.config.envs.add(key=key, value=value.encode())
    create.sandbox_config.linux.cgroup_parent = request.pod_cgroup_parent
    return create


def node_facts(cpus: str | None, mems: str | None) -> NodeFacts:
    """The node's facts as given, this machine's for what is not."""
    if cpus is not None and mems is not None:
        return NodeFacts(parse_id_list(cpus), parse_id_list(mems))
    facts = read_node_facts()
    if cpus is not None:
        facts = replace(facts, online_cpus=parse_id_list(cpus))
    if mems is not None:
        facts = replace(facts, memory_nodes=parse_id_list(mems))
    return facts


@contextlib.contextmanager
def cgroup_hierarchy(cgroups: Mapping[str, Mapping[str, str]] | None) -> Iterator[ParentCpusets | None]:
    """``cgroups`` as a cgroup v1 cpuset hierarchy, in a temporary directory
    that the proxy's ParentCpusets reads (None: no parent judged)."""
    if cgroups is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="check-answer-") as mount:
        for cgroup, files in cgroups.items():
            if not cgroup.startswith("/") or not cgroup.strip("/"):
                raise ValueError(f"cgroup {cgroup!r}: a path in the cpuset hierarchy below its root, as /kubepods")
            unknown = set(files) - set(FILES.values())
            if unknown:
                raise ValueError(f"cgroup {cgroup!r}: {', '.join(sorted(unknown))}: only {', '.join(FILES.values())}")
            directory = Path(mount, cgroup.strip("/"))
            directory.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (directory / name).write_text(text)
        yield ParentCpusets(Path(mount))
