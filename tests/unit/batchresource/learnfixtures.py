"""A RuntimeLearner on a fake runtime and cgroup tree, and the cgroups kubelet leaves a BE pod."""

from __future__ import annotations

from pathlib import Path

from hooks.batchresource.learn import RuntimeLearner
from hooks.batchresource.server import BatchResourceHook

from .fakecgroup import make_cgroup, read, write
from .fakeruntime import FakeLister, FakePod, FakeRuntimeStub
from .hookfixtures import make_hook
from .specs import annotation, container

MIB = 2**20
ONE = annotation({"main": container("500", "128Mi", "500", "128Mi")})
TWO = annotation({"main": container("500", "128Mi", "500", "128Mi"), "side": container("250", "64Mi", "250", "64Mi")})
KUBELET_V1 = ("2", "-1", "9223372036854771712")  # least shares, no quota, no limit


def learner_for(tmp_path: Path, *pods: FakePod, version: int = 1) -> tuple[RuntimeLearner, FakeRuntimeStub]:
    hook = make_hook(tmp_path, version)
    stub = FakeRuntimeStub(*pods)
    return RuntimeLearner(hook.pods, FakeLister(stub)), stub


def hook_with_learner(
    tmp_path: Path, *pods: FakePod, version: int = 1, **settings: object
) -> tuple[BatchResourceHook, FakeRuntimeStub]:
    """A hook built with a runtime_endpoint (so with its own learner), listing a fake runtime."""
    hook = make_hook(tmp_path, version, runtime_endpoint="/fake/runtime.sock", **settings)
    assert hook.learner is not None
    stub = FakeRuntimeStub(*pods)
    hook.learner.lister = FakeLister(stub)
    return hook, stub


def kubelet_be_cgroups(root: Path, version: int, *relative: str) -> None:
    """Pod and container cgroups as kubelet and runc leave a BE pod: least shares, no quota, no limit."""
    for rel in relative:
        make_cgroup(root, version, rel)
        write(root, version, rel, "cpu.shares" if version == 1 else "cpu.weight", "2" if version == 1 else "1")


def values(root: Path, version: int, relative: str) -> tuple[str, ...]:
    if version == 1:
        return tuple(read(root, 1, relative, name) for name in ("cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes"))
    return tuple(read(root, 2, relative, name) for name in ("cpu.weight", "cpu.max", "memory.max"))
