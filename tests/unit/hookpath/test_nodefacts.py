"""nodefacts.py: hook answers are judged by the node's facts as they are now
(CPU and memory hotplug after start), read again only when they may be stale."""

from __future__ import annotations

import dataclasses
import errno
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.nodefacts import HOLD_OFF, MAX_AGE, NodeFactsSource, format_id_list
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.hookpath.validate import NodeFacts, NodeFactsReader, parse_id_list, read_node_facts
from tests.fakesysfs import fake_root, on_cgroup_v2, set_nodes_with_memory, set_online_cpus

from .dispatchfakes import Chain, NoConnections

HOOK = HookType.PRE_CREATE_CONTAINER
STRICT = HookServerConfig("strict.json", "/run/strict.sock", FailurePolicy.FAIL, frozenset({HOOK}), timeout=1.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Counted:
    """The node's facts from a fake root, counting the reads."""

    def __init__(self, root: Path) -> None:
        self.root, self.reads = root, 0

    def __call__(self) -> NodeFacts:
        self.reads += 1
        return read_node_facts(self.root)


class Answers(NoConnections):
    """Answers every call with the resources of the moment."""

    def __init__(self, **resources: object) -> None:
        self.resources = hookapi.LinuxContainerResources(**resources)

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        return hookapi.ContainerResourceHookResponse(container_resources=self.resources).SerializeToString()


class Node:
    """A dispatcher with one Fail server, judging by a fake sysfs tree read through ``reader``."""

    def __init__(self, root: Path, transport: Answers) -> None:
        self.root, self.clock, self.reader = root, Clock(), Counted(root)
        self.source = NodeFactsSource(self.reader, clock=self.clock)
        self.dispatcher = Dispatcher(Chain(STRICT), node=self.source, transport=transport)  # type: ignore[arg-type]
        self.error = ""

    async def taken(self) -> bool:
        """Whether the hook's answer goes on to the runtime (False: refused as the kernel would, ``error`` says why)."""
        applied: list[object] = []

        async def build() -> hookapi.ContainerResourceHookRequest:
            return hookapi.ContainerResourceHookRequest()

        try:
            await self.dispatcher.run_pre(HOOK, build, lambda answer, server: applied.append(answer) is None, {})
        except HookError as refused:
            assert "kernel would refuse" in refused.cause
            self.error = refused.cause
            return False
        return applied != []


def four_cpus(tmp_path: Path) -> Path:
    """CPUs 0-3 and node 0 with memory; node 1 online without memory (cgroup v1 rule)."""
    root = fake_root(tmp_path, cpus="0-3\n", nodes="0-1\n")
    set_nodes_with_memory(root, "0\n")
    return root


def unreadable(monkeypatch: pytest.MonkeyPatch, *names: str) -> set[str]:
    """The names of the files that Path.read_text fails to read from now
    (EMFILE, a momentary failure): change the set in place to change which
    (empty: all read)."""
    failing = set(names)
    read_text = Path.read_text

    def emfile(path: Path, *args: object, **kwargs: object) -> str:
        if path.name in failing:
            raise OSError(errno.EMFILE, "Too many open files")
        return read_text(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", emfile)
    return failing


def v2_mode_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, set[str]]:
    """Four CPUs on cgroup v2 under 5.15 (memory nodes fixed at boot), whose
    cgroup mode and kernel release fail to read until ``failing`` is emptied."""
    root = four_cpus(tmp_path)
    on_cgroup_v2(root, "5.15.0-105-generic\n")
    return root, unreadable(monkeypatch, "cgroup.controllers", "osrelease")


@pytest.mark.parametrize(("answer", "hotplug", "logged"), [
    ({"cpuset_cpus": "2-4"}, lambda root: set_online_cpus(root, "0-4\n"), ("online_cpus", "0-3", "0-4")),
    ({"cpuset_cpus": "1", "cpuset_mems": "1"}, lambda root: set_nodes_with_memory(root, "0-1\n"), ("memory_nodes", "0", "0-1")),
])
async def test_a_cpu_or_memory_node_brought_online_after_start_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, answer: dict[str, str], hotplug: Callable[[Path], None],
    logged: tuple[str, str, str],
) -> None:
    node = Node(four_cpus(tmp_path), Answers(**answer))
    hotplug(node.root)
    caplog.set_level(logging.INFO, logger="runtimeproxy.hookpath.nodefacts")
    assert await node.taken()
    assert node.reader.reads == 2  # at start, and once for the answer the old facts refused
    assert await node.taken()
    assert node.reader.reads == 2  # the fresh facts are kept
    (changed,) = [r for r in caplog.records if r.getMessage() == "node facts changed"]
    field, before, after = logged
    assert changed.levelno == logging.INFO
    assert (getattr(changed, f"{field}_before"), getattr(changed, field)) == (before, after)


async def test_on_cgroup_v2_before_5_18_a_node_that_gained_memory_after_start_stays_refused(tmp_path: Path) -> None:
    """There the kernel fixed the nodes cpuset.mems takes at boot (v2 hotplug adds none): runc would fail."""
    root = four_cpus(tmp_path)
    on_cgroup_v2(root, "5.15.0-105-generic\n")
    node = Node(root, Answers(cpuset_mems="1"))
    set_nodes_with_memory(root, "0-1\n")
    assert not await node.taken()
    assert node.reader.reads == 2  # read again: node 1 has memory now, and is kept out
    assert node.source.current.memory_nodes == frozenset({0})
    assert "memory nodes without memory now or at start (cgroup v2 before Linux 5.18) (1)" in node.error


async def test_on_cgroup_v2_before_5_18_memory_nodes_may_shrink_and_come_back_within_the_first_read(tmp_path: Path) -> None:
    root = four_cpus(tmp_path)
    on_cgroup_v2(root, "5.15.0-105-generic\n")
    set_nodes_with_memory(root, "0-1\n")
    node = Node(root, Answers(cpuset_mems="1"))
    assert await node.taken()
    set_nodes_with_memory(root, "0\n")
    node.clock.now = MAX_AGE
    assert not await node.taken()  # node 1 lost its memory: refused, the stricter side
    set_nodes_with_memory(root, "0-1\n")
    node.clock.now = MAX_AGE + HOLD_OFF
    assert await node.taken()  # back within the set the kernel took at boot


async def test_hotplugs_in_a_row_are_each_taken_at_once(tmp_path: Path) -> None:
    """A re-read that found a change holds no later one off."""
    transport = Answers(cpuset_cpus="4")
    node = Node(four_cpus(tmp_path), transport)
    set_online_cpus(node.root, "0-4\n")
    assert await node.taken()
    set_online_cpus(node.root, "0-5\n")
    transport.resources.cpuset_cpus = "5"
    assert await node.taken()
    assert node.reader.reads == 3


async def test_a_hook_naming_cpus_the_node_lacks_costs_a_read_per_hold_off_not_per_call(tmp_path: Path) -> None:
    node = Node(four_cpus(tmp_path), Answers(cpuset_cpus="64"))
    for _ in range(5):
        assert not await node.taken()
    assert node.reader.reads == 2  # at start, and once for the first refused answer: it found nothing new
    node.clock.now = HOLD_OFF * 0.99
    assert not await node.taken()
    assert node.reader.reads == 2
    node.clock.now = HOLD_OFF
    assert not await node.taken()
    assert node.reader.reads == 3


async def test_the_bound_a_cpu_brought_online_just_after_a_fruitless_read_waits_out_the_hold_off(tmp_path: Path) -> None:
    """Documented: after a re-read that found nothing new, an answer naming a CPU
    that came online since is refused until ``HOLD_OFF`` has passed."""
    transport = Answers(cpuset_cpus="64")
    node = Node(four_cpus(tmp_path), transport)
    assert not await node.taken()  # a fruitless re-read
    set_online_cpus(node.root, "0-4\n")
    transport.resources.cpuset_cpus = "4"
    node.clock.now = HOLD_OFF / 2
    assert not await node.taken()
    node.clock.now = HOLD_OFF
    assert await node.taken()


async def test_a_cpu_gone_offline_is_refused_once_the_facts_are_max_age_old(tmp_path: Path) -> None:
    node = Node(four_cpus(tmp_path), Answers(cpuset_cpus="3"))
    assert await node.taken()
    set_online_cpus(node.root, "0-2\n")
    node.clock.now = MAX_AGE * 0.99
    assert await node.taken()  # valid against the facts of the moment: no read
    assert node.reader.reads == 1
    node.clock.now = MAX_AGE
    assert not await node.taken()
    assert node.reader.reads == 2
    set_online_cpus(node.root, "0-3\n")
    node.clock.now = MAX_AGE * 1.99
    assert await node.taken()  # back online: the refused answer's re-read finds it
    assert node.reader.reads == 3


async def test_a_read_for_age_that_finds_nothing_new_holds_the_next_off_too(tmp_path: Path) -> None:
    """Not two reads back to back: one for age, then one more for the same refused answer."""
    node = Node(four_cpus(tmp_path), Answers(cpuset_cpus="64"))
    node.clock.now = MAX_AGE
    assert not await node.taken()
    assert node.reader.reads == 2  # for age: nothing new, still refused
    node.clock.now = MAX_AGE + HOLD_OFF * 0.99
    assert not await node.taken()
    assert node.reader.reads == 2
    node.clock.now = MAX_AGE + HOLD_OFF
    assert not await node.taken()
    assert node.reader.reads == 3


async def test_answers_without_cpusets_never_read_the_facts(tmp_path: Path) -> None:
    node = Node(four_cpus(tmp_path), Answers(cpu_quota=-5))
    node.clock.now = MAX_AGE * 3
    for _ in range(3):
        assert not await node.taken()
    assert node.reader.reads == 1


async def test_an_answer_refused_for_other_fields_than_cpusets_reads_nothing(tmp_path: Path) -> None:
    """A negative quota beside a valid cpuset: no read of the node can make it taken."""
    node = Node(four_cpus(tmp_path), Answers(cpuset_cpus="1", cpu_quota=-5))
    for second in range(5):
        node.clock.now = second * HOLD_OFF
        assert not await node.taken()
    assert node.reader.reads == 1  # at start only


def test_a_failed_read_keeps_the_last_facts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = four_cpus(tmp_path)
    source = NodeFactsSource(lambda: read_node_facts(root))
    (root / "sys/devices/system/cpu/online").unlink()
    assert source.refresh() is False
    assert source.current.online_cpus == frozenset(range(4))
    assert "node facts not read again; the last ones stand" in caplog.messages


class Failing:
    """CPUs 0-3 and node 0, until ``error`` is set: then each read raises it."""

    def __init__(self) -> None:
        self.reads = 0
        self.error: Exception | None = None

    def __call__(self) -> NodeFacts:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return NodeFacts(online_cpus=frozenset(range(4)), memory_nodes=frozenset({0}))


def test_a_failing_read_raises_nothing_holds_off_and_is_warned_once_per_failure(caplog: pytest.LogCaptureFixture) -> None:
    reader, clock = Failing(), Clock()
    source = NodeFactsSource(reader, clock=clock)
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.hookpath.nodefacts")
    shown, answer = hookapi.LinuxContainerResources(), hookapi.LinuxContainerResources(cpuset_cpus="64")

    def judge_for(seconds: int) -> None:
        for _ in range(seconds):
            for _ in range(3):  # calls within one hold-off
                (reason,) = source.invalid_answer(shown, answer)  # nothing raised: the facts that stand refuse it
                assert "(64)" in reason
            clock.now += HOLD_OFF

    reader.error = RuntimeError("not a sysfs we know")  # not OSError nor ValueError: unforeseen
    judge_for(3)
    assert reader.reads == 1 + 3  # at start, then once per hold-off
    reader.error = OSError(5, "Input/output error")
    judge_for(2)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(w.getMessage(), w.error) for w in warnings] == [
        ("node facts not read again; the last ones stand", "RuntimeError: not a sysfs we know"),
        ("node facts not read again; the last ones stand", "OSError: [Errno 5] Input/output error"),
    ]
    assert [(w.online_cpus, w.memory_nodes) for w in warnings] == [("0-3", "0")] * 2  # the facts that stand
    assert [bool(w.exc_info) for w in warnings] == [True, False]  # a traceback for the unforeseen one
    reader.error = None
    judge_for(1)
    assert [(r.getMessage(), r.error_before) for r in caplog.records if r.levelno == logging.INFO] == [
        ("node facts read again", "OSError: [Errno 5] Input/output error"),
    ]


@pytest.mark.parametrize("ids", [{0}, {0, 1, 2, 3}, {0, 2, 3, 4, 8, 10, 11}])
def test_format_id_list_is_what_parse_id_list_reads(ids: set[int]) -> None:
    assert parse_id_list(format_id_list(ids)) == frozenset(ids)


def test_format_id_list_joins_runs() -> None:
    assert format_id_list({8, 0, 2, 3, 4}) == "0,2-4,8"
    assert format_id_list(set()) == ""


def test_the_cgroup_mode_and_kernel_release_are_read_once_not_at_each_re_read(tmp_path: Path) -> None:
    """No hotplug changes them while the process runs: a re-read reads the CPUs and nodes alone."""
    root = four_cpus(tmp_path)
    on_cgroup_v2(root, "5.15.0-105-generic\n")
    source = NodeFactsSource(NodeFactsReader(root))
    first = source.current
    assert first.memory_nodes_fixed_at_boot
    # Gone: read again, they would give cgroup v1's rule (and no kernel to judge).
    (root / "sys/fs/cgroup/cgroup.controllers").unlink()
    (root / "proc/sys/kernel/osrelease").unlink()
    set_online_cpus(root, "0-4\n")
    assert source.refresh()  # read again: the CPUs changed
    assert source.current == dataclasses.replace(first, online_cpus=frozenset(range(5)))  # the v2 rule stands


def test_a_cgroup_mode_or_kernel_release_that_could_not_be_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A momentary failure (EMFILE as the process starts) gives the stricter
    rule for now, not for the process's life."""
    root, failing = v2_mode_unread(tmp_path, monkeypatch)
    reader = NodeFactsReader(root)
    assert not reader().memory_nodes_fixed_at_boot  # v1's rule, for now
    failing.clear()
    assert reader().memory_nodes_fixed_at_boot  # read: cgroup v2 before 5.18
    (root / "sys/fs/cgroup/cgroup.controllers").unlink()
    assert reader().memory_nodes_fixed_at_boot  # and kept


def test_a_cgroup_mode_read_at_last_is_logged_as_that_not_as_a_node_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root, failing = v2_mode_unread(tmp_path, monkeypatch)
    source = NodeFactsSource(NodeFactsReader(root))
    caplog.set_level(logging.DEBUG, logger="runtimeproxy.hookpath.nodefacts")
    assert not source.refresh()
    assert [r.getMessage() for r in caplog.records] == ["node facts read under the stricter rule: not read yet"]
    assert caplog.records[0].unread == ["cgroup mode", "kernel release"]
    caplog.clear()
    failing.clear()
    assert source.refresh()  # judged again under cgroup v2's rule before 5.18
    assert source.current.memory_nodes_fixed_at_boot
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "cgroup mode and kernel release read at last (no hotplug); node facts under the rule now known")]
    caplog.clear()
    assert not source.refresh()
    assert caplog.records == []


def test_a_cgroup_mode_read_by_a_read_that_failed_after_it_is_still_logged_as_read_at_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The re-read reads the cgroup mode and kernel release, then fails on the
    # CPU list: the next one that works is what took them.
    root, failing = v2_mode_unread(tmp_path, monkeypatch)
    source = NodeFactsSource(NodeFactsReader(root))
    failing.clear()
    failing.add("online")
    assert not source.refresh()
    caplog.clear()
    caplog.set_level(logging.INFO, logger="runtimeproxy.hookpath.nodefacts")
    failing.clear()
    assert source.refresh()
    assert [r.getMessage() for r in caplog.records] == [
        "node facts read again",
        "cgroup mode and kernel release read at last (no hotplug); node facts under the rule now known"]
