"""Every chain of 2 to 4 PreCreateContainer hooks (4: pins and moves apart), each Fail or Ignore,
answering nothing, a pin, a move or both, judged against runc's rule (the
container's final cpuset within its final parent's, every answer applied).

Where the proxy's outcome differs from that rule, it must be one of the
documented prices (docs/hook-files.md, "cgroup v1: cpusets and the pod's parent"):

 * KUBELET: kubelet's own cpuset is not judged on a move: the call passes and
   runc fails the container.
 * IGNORE_MOVE_ALONG: an Ignore move with hooks after it is not judged for an
   earlier hook's cpuset it takes along; no later hook set it again, so it
   reaches runc outside the parent moved to.
 * DROPPED_IGNORE: an Ignore answer refused as it comes, by the parent in
   effect after it (its own pin by the parent it moves to, if it moves), is
   dropped whole, even where a later hook's move or pin would have made the
   call fit; the outcome is then runc's for the answers kept.

Anything else fails the test, and so does a refusal or an ``invalid_value``
count naming a hook for a value it did not answer (or for a pair it did not
complete), a Fail answer dropped, or a call counted other than once.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.hookpath.dispatch import Dispatcher, HookError
from runtimeproxy.hookpath.hookfile import FailurePolicy, HookServerConfig
from runtimeproxy.hookpath.nodefacts import NodeFactsSource
from runtimeproxy.hookpath.parentcpuset import ParentCpusets
from runtimeproxy.hookpath.validate import parse_id_list, read_node_facts
from tests.fakesysfs import CPUSET_MOUNT, cgroup_v1_cpuset, fake_root

from .dispatchfakes import Chain, NoConnections
from .test_parent_chain import ISO
from .test_parent_judged import CREATE, NARROW, POD

FAIL, IGNORE = FailurePolicy.FAIL, FailurePolicy.IGNORE
WIDE = "/kubepods/wide"
CPUS = {POD: "0-1", ISO: "2-3", WIDE: "0-3", NARROW: "0"}
KUBELETS = "0-1"


@dataclass(frozen=True)
class Answer:
    pin: str = ""
    move: str = ""

    def response(self) -> hookapi.ContainerResourceHookResponse:
        return hookapi.ContainerResourceHookResponse(
            pod_cgroup_parent=self.move, container_resources=hookapi.LinuxContainerResources(cpuset_cpus=self.pin))


def answers(pins: tuple[str, ...], moves: tuple[str, ...], both: bool = True) -> list[Answer]:
    return [Answer(), *(Answer(pin=p) for p in pins), *(Answer(move=m) for m in moves),
            *(Answer(p, m) for p in pins for m in moves if both)]


def fits(parent: str, cpus: str) -> bool:
    return parse_id_list(cpus) <= parse_id_list(CPUS[parent])


class Metrics:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def hook_call(
        self, server: str, hook: str, outcome: str, seconds: float, cause: str | None = None, *,
        caller_cancelled: bool = False,
    ) -> None:
        self.calls.append((server, outcome))

    def keep_hook_stats(self, servers: object) -> None:
        pass


class Answering(NoConnections):
    def __init__(self) -> None:
        self.answers: dict[str, bytes] = {}

    async def call(
        self, endpoint: str, method: str, request: bytes, timeout: float, owner_uid: int | None
    ) -> bytes:
        return self.answers[endpoint]


@dataclass
class Outcome:
    final: tuple[str, str] | None  # None: refused
    blamed: int | None
    cause: str
    kept: list[int]  # the answers applied, in chain order
    counted: dict[int, list[str]]


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        root = fake_root(tmp_path, cpus="0-3\n", nodes=None)
        cgroup_v1_cpuset(root, {"/": ("0-3", "0"), **{p: (c, "0") for p, c in CPUS.items()}})
        self.source = NodeFactsSource(lambda: read_node_facts(root), parents=ParentCpusets(root / CPUSET_MOUNT),
                                      clock=lambda: 100.0)
        self.servers = {(k, p): HookServerConfig(f"h{k}.json", f"/run/h{k}.sock", p, frozenset({CREATE}), timeout=1.0)
                        for k in range(4) for p in (FAIL, IGNORE)}

    async def run(self, chain: tuple[tuple[FailurePolicy, Answer], ...]) -> Outcome:
        transport, metrics = Answering(), Metrics()
        for k, (_, answer) in enumerate(chain):
            transport.answers[f"/run/h{k}.sock"] = answer.response().SerializeToString()
        servers = [self.servers[k, policy] for k, (policy, _) in enumerate(chain)]
        dispatcher = Dispatcher(Chain(*servers), metrics, node=self.source, transport=transport)  # type: ignore[arg-type]
        request = hookapi.ContainerResourceHookRequest(
            pod_cgroup_parent=POD, container_resources=hookapi.LinuxContainerResources(cpuset_cpus=KUBELETS))
        kept: list[int] = []

        async def build() -> hookapi.ContainerResourceHookRequest:
            return hookapi.ContainerResourceHookRequest.FromString(request.SerializeToString())

        def apply(answer: hookapi.ContainerResourceHookResponse, server: HookServerConfig) -> bool:
            kept.append(int(server.name[1:-5]))
            request.pod_cgroup_parent = answer.pod_cgroup_parent or request.pod_cgroup_parent
            cpus = answer.container_resources.cpuset_cpus
            request.container_resources.cpuset_cpus = cpus or request.container_resources.cpuset_cpus
            return True

        final: tuple[str, str] | None = None
        blamed, cause = None, ""
        try:
            await dispatcher.run_pre(CREATE, build, apply, {})
            final = (request.pod_cgroup_parent, request.container_resources.cpuset_cpus)
        except HookError as err:
            blamed, cause = int(err.server.name[1:-5]), err.cause
        counted: dict[int, list[str]] = {}
        for name, outcome in metrics.calls:
            counted.setdefault(int(name[1:-5]), []).append(outcome)
        return Outcome(final, blamed, cause, kept, counted)


def applied(chain: tuple[tuple[FailurePolicy, Answer], ...], which: list[int] | range) -> tuple[str, str, int | None, int | None]:
    """The parent and cpuset once the answers ``which`` are applied, with the
    index of the hook that set each last (None: kubelet's)."""
    parent, cpus, moved_by, pinned_by = POD, KUBELETS, None, None
    for k in which:
        answer = chain[k][1]
        if answer.move and answer.move != parent:
            parent, moved_by = answer.move, k
        if answer.pin and answer.pin != cpus:
            cpus, pinned_by = answer.pin, k
    return parent, cpus, moved_by, pinned_by


def refused_as_it_comes(chain: tuple[tuple[FailurePolicy, Answer], ...], k: int, kept: list[int]) -> bool:
    """Whether answer ``k`` is refused judged as it comes: its own pin by the
    parent in effect after it; the cpuset an earlier hook set that its move
    takes along, by the parent moved to (not an Ignore move with hooks after it)."""
    parent, cpus, _, pinned_by = applied(chain, [j for j in kept if j < k])
    policy, answer = chain[k]
    after = answer.move or parent
    if answer.pin and answer.pin != cpus:
        return not fits(after, answer.pin)
    last = k == len(chain) - 1
    along = answer.move and answer.move != parent and pinned_by is not None
    return bool(along) and (policy is FAIL or last) and not fits(after, cpus)


def responsible(chain: tuple[tuple[FailurePolicy, Answer], ...], k: int, kept: list[int]) -> bool:
    """Whether hook ``k``'s answer left the kept answers' final call outside
    its parent: it set that cpuset last, or moved last, taking along a hook's."""
    parent, cpus, moved_by, pinned_by = applied(chain, kept)
    if fits(parent, cpus):
        return False
    return pinned_by == k or (moved_by == k and pinned_by is not None and pinned_by < k)


REASON = re.compile(r"cpuset_cpus '([^']*)' names CPUs outside the parent cgroup (\S+) \([^)]*\)(?:, set by h(\d)\.json)?")


def judge(chain: tuple[tuple[FailurePolicy, Answer], ...], out: Outcome) -> tuple[str, list[str]]:
    """The outcome's class (``agree`` or a documented price; ``UNCLASSIFIED``)
    and what is wrong with its blame and counts."""
    n = len(chain)
    wrong: list[str] = []
    called = range(n) if out.blamed is None else range(out.blamed + 1) if out.blamed not in out.kept else range(n)
    for k in range(n):
        if out.counted.get(k, []) != out.counted.get(k, [])[:1] or (k in called) != (k in out.counted):
            wrong.append(f"h{k} counted {out.counted.get(k)}")
    dropped = [k for k in called if k not in out.kept and k != out.blamed]
    wrong += [f"h{k} Fail, dropped" for k in dropped if chain[k][0] is FAIL]
    wrong += [f"h{k} dropped, not refused as it comes" for k in dropped if not refused_as_it_comes(chain, k, out.kept)]
    kept = sorted(set(out.kept) | ({out.blamed} if out.blamed is not None else set()) | set(range(called.stop, n)))
    at_end = out.blamed in out.kept  # a deferred answer refused at the chain's end
    for k, outcomes in out.counted.items():
        if "invalid_value" in outcomes and k not in dropped:
            ok = out.final is None and (
                responsible(chain, k, kept) if at_end else refused_as_it_comes(chain, k, out.kept))
            if not ok:
                wrong.append(f"h{k} counted invalid_value for what it did not answer")
    if out.blamed is not None:
        wrong += _blame(chain, out, kept, at_end)

    everything = applied(chain, range(n))
    runc_all = fits(everything[0], everything[1])
    parent, cpus, moved_by, pinned_by = applied(chain, kept)
    runc_kept = fits(parent, cpus)
    if out.final is None:
        if not runc_all:
            return "agree", wrong
        return ("DROPPED_IGNORE" if dropped and not runc_kept else "UNCLASSIFIED"), wrong
    if out.final != (parent, cpus):
        wrong.append(f"final {out.final} is not the kept answers' {(parent, cpus)}")
    if not runc_kept:
        if pinned_by is None:
            return "KUBELET", wrong
        if moved_by is not None and chain[moved_by][0] is IGNORE and moved_by < n - 1 and pinned_by < moved_by:
            return "IGNORE_MOVE_ALONG", wrong
        return "UNCLASSIFIED", wrong
    if out.final == everything[:2]:
        return "agree", wrong
    return ("DROPPED_IGNORE" if dropped else "UNCLASSIFIED"), wrong


def _blame(chain: tuple[tuple[FailurePolicy, Answer], ...], out: Outcome, kept: list[int], at_end: bool) -> list[str]:
    assert out.blamed is not None
    policy, answer = chain[out.blamed]
    found = REASON.search(out.cause)
    if policy is IGNORE or found is None:
        return [f"blamed h{out.blamed} ({policy.value}): {out.cause}"]
    value, parent, setter = found.groups()
    if setter is not None:
        if chain[int(setter)][1].pin != value or answer.move != parent:
            return [f"h{out.blamed} blamed for h{setter}'s {value!r} taken along to {parent}"]
    elif answer.pin != value:
        return [f"h{out.blamed} blamed for {value!r}, which it did not answer"]
    if at_end and not responsible(chain, out.blamed, kept):
        return [f"h{out.blamed} blamed at the end for a call it did not leave outside its parent"]
    return []


def chains(n: int, choices: list[Answer]) -> list[tuple[tuple[FailurePolicy, Answer], ...]]:
    return list(itertools.product(itertools.product((FAIL, IGNORE), choices), repeat=n))


def show(chain: tuple[tuple[FailurePolicy, Answer], ...]) -> str:
    def one(policy: FailurePolicy, a: Answer) -> str:
        parts = ([f"pin{a.pin}"] if a.pin else []) + ([f"mv{a.move.rsplit('/', 1)[-1]}"] if a.move else [])
        return f"{policy.value[0]}:{'+'.join(parts) or '-'}"
    return " ; ".join(one(*hook) for hook in chain)


async def classify(tmp_path: Path, every: list[tuple[tuple[FailurePolicy, Answer], ...]]) -> tuple[Counter[str], list[str]]:
    harness = Harness(tmp_path)
    classes: Counter[str] = Counter()
    bad: list[str] = []
    logging.disable(logging.CRITICAL)
    try:
        for chain in every:
            out = await harness.run(chain)
            kind, wrong = judge(chain, out)
            classes[kind] += 1
            if kind == "UNCLASSIFIED" or wrong:
                bad.append(f"{show(chain)} -> {out.final or f'h{out.blamed}: {out.cause}'} {wrong}")
    finally:
        logging.disable(logging.NOTSET)
    return classes, bad


@pytest.mark.parametrize(("n", "choices"), [
    (2, answers(("1", "2", "3", "0-3"), (ISO, WIDE, NARROW))),
    (3, answers(("1", "2", "0-3"), (ISO, WIDE))),
    (4, answers(("1", "2"), (ISO, NARROW), both=False)),
])
async def test_every_disagreement_with_runc_is_a_documented_price(tmp_path: Path, n: int, choices: list[Answer]) -> None:
    classes, bad = await classify(tmp_path, chains(n, choices))
    assert bad == [], f"{len(bad)} chains: " + "\n".join(bad[:40])
    assert set(classes) <= {"agree", "KUBELET", "IGNORE_MOVE_ALONG", "DROPPED_IGNORE"}
