"""``python -m bench soak``: a long mixed load through the proxy, checked for leaks.

    python -m bench soak [--calls 100000] [--direct-calls 20000] [--concurrency 16] [--quick] [--keep]

A private containerd, a no-op hook server on every hook point (Ignore) and
the proxy as a process in front of them. ``--concurrency`` workers issue the
same mix of calls first straight at containerd (``--direct-calls``: what
errors containerd itself gives), then through the proxy (``--calls``):
Version, ListPodSandbox, ListContainers, ContainerStatus, PodSandboxStatus
and, now and then, ExecSync and a whole pod lifecycle (seven calls).

The proxy's resident memory and open file descriptors are read from
/proc/PID at every tenth of the run. The run fails (exit 1) if the proxy
gave an error (method and code) that direct calls did not, if its RSS grew
by 10% or more between the 20% mark and the end, if it holds more file
descriptors at the end than at the 20% mark, or if it died.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from hooks.sdk import write_hook_config
from runtimeproxy.host.containerd import LocalContainerd
from runtimeproxy.host.unixsocket import grpc_target

from . import lifecycle as lc
from .procs import (
    BenchError,
    HookServerChild,
    ProxyChild,
    memory_mib,
    say,
    wait_cri_version,
    wait_idle,
    work_dir,
)
from .proxymetrics import ALL_HOOKS

RSS_GROWTH_LIMIT = 0.10
CALL_TIMEOUT = 30.0
FIXTURE_PODS = 2
FIXTURE_CONTAINERS = 4  # started: ContainerStatus and ExecSync need running ones
EXEC_EVERY = 100  # one ticket in this many is an ExecSync
LIFECYCLE_EVERY = 250  # one ticket in this many is a pod lifecycle (counts its seven calls)


@dataclass(frozen=True)
class SoakOptions:
    calls: int = 100_000
    direct_calls: int = 20_000
    concurrency: int = 16
    keep: bool = False


def quick(opts: SoakOptions) -> SoakOptions:
    return SoakOptions(calls=5_000, direct_calls=1_000, concurrency=opts.concurrency, keep=opts.keep)


@dataclass
class Sample:
    calls: int
    rss_mib: float
    fds: int


@dataclass
class Phase:
    """One target's run: calls made, errors by (method, code), proxy samples."""

    calls: int = 0
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Mix:
    """Which call a ticket is, and making it."""

    def __init__(self, stub: v1_grpc.RuntimeServiceStub, cleanup: v1_grpc.RuntimeServiceStub,
                 pods: list[str], containers: list[str], logs: Path) -> None:
        self.stub, self.cleanup, self.pods, self.containers, self.logs = stub, cleanup, pods, containers, logs

    async def call(self, ticket: int) -> tuple[str, int]:
        """Make the ticket's call(s); returns the method name and how many CRI calls it made."""
        s, pick = self.stub, ticket // 7
        if ticket % LIFECYCLE_EVERY == LIFECYCLE_EVERY - 1:
            await lc.lifecycle(s, self.cleanup, self.logs, f"soak{ticket}")
            return "lifecycle", len(lc.STEPS)
        if ticket % EXEC_EVERY == EXEC_EVERY - 1:
            cid = self.containers[pick % len(self.containers)]
            reply = await s.ExecSync(v1.ExecSyncRequest(container_id=cid, cmd=["/bin/sh", "-c", "true"], timeout=10),
                                     timeout=CALL_TIMEOUT)
            if reply.exit_code != 0:
                raise RuntimeError(f"ExecSync exit code {reply.exit_code}: {reply.stderr[:200]!r}")
            return "ExecSync", 1
        kind = ticket % 10
        if kind < 3:
            await s.Version(v1.VersionRequest(), timeout=CALL_TIMEOUT)
            return "Version", 1
        if kind < 5:
            await s.ListPodSandbox(v1.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)
            return "ListPodSandbox", 1
        if kind < 7:
            await s.ListContainers(v1.ListContainersRequest(), timeout=CALL_TIMEOUT)
            return "ListContainers", 1
        if kind < 9:
            cid = self.containers[pick % len(self.containers)]
            await s.ContainerStatus(v1.ContainerStatusRequest(container_id=cid), timeout=CALL_TIMEOUT)
            return "ContainerStatus", 1
        await s.PodSandboxStatus(v1.PodSandboxStatusRequest(pod_sandbox_id=self.pods[pick % len(self.pods)]),
                                 timeout=CALL_TIMEOUT)
        return "PodSandboxStatus", 1


async def drive(mix: Mix, calls: int, concurrency: int, proxy_pid: int | None) -> Phase:
    """``concurrency`` workers take tickets until ``calls`` CRI calls were made."""
    phase = Phase()
    marks = [calls * k // 10 for k in range(1, 11)]
    tickets = iter(range(10 * calls))  # more than enough: a lifecycle ticket makes seven calls

    def sample() -> None:
        while marks and phase.calls >= marks[0]:
            marks.pop(0)
            if proxy_pid is not None:
                phase.samples.append(Sample(phase.calls, memory_mib(proxy_pid)["rss_mib"], open_fds(proxy_pid)))

    async def worker() -> None:
        for ticket in tickets:
            if phase.calls >= calls:
                return
            try:
                _, made = await mix.call(ticket)
            except lc.LifecycleError as exc:
                made = lc.STEPS.index(exc.step) + 1
                failed(f"{exc.step}", exc.__cause__ or exc)
            except aio.AioRpcError as exc:
                made = 1
                failed(_method_of(ticket), exc)
            except RuntimeError as exc:
                made = 1
                failed(_method_of(ticket), exc)
            phase.calls += made
            sample()

    def failed(method: str, exc: BaseException) -> None:
        code = exc.code().name if isinstance(exc, aio.AioRpcError) else type(exc).__name__
        phase.errors[(method, code)] += 1
        if len(phase.error_samples) < 20:
            phase.error_samples.append(f"{method}: {exc}")

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    phase.seconds = time.monotonic() - started
    return phase


_READS = ("Version",) * 3 + ("ListPodSandbox",) * 2 + ("ListContainers",) * 2 + ("ContainerStatus",) * 2 + (
    "PodSandboxStatus",)


def _method_of(ticket: int) -> str:
    return "ExecSync" if ticket % EXEC_EVERY == EXEC_EVERY - 1 else _READS[ticket % 10]


async def fixture(stub: v1_grpc.RuntimeServiceStub, logs: Path) -> tuple[list[str], list[str]]:
    """Pods with running containers for the status and exec calls."""
    pods = await lc.populate(stub, logs, pods=FIXTURE_PODS, containers=FIXTURE_CONTAINERS)
    listed = await stub.ListContainers(v1.ListContainersRequest(), timeout=CALL_TIMEOUT)
    containers = [c.id for c in listed.containers]
    for cid in containers:
        await stub.StartContainer(v1.StartContainerRequest(container_id=cid), timeout=CALL_TIMEOUT)
    return pods, containers


def verdict(direct: Phase, proxied: Phase, alive: bool) -> list[str]:
    problems = [] if alive else ["the proxy died during the run"]
    extra = {key: n for key, n in proxied.errors.items() if key not in direct.errors}
    if extra:
        problems.append(f"errors through the proxy that direct calls did not get: {extra}")
    if len(proxied.samples) >= 2:
        early, last = proxied.samples[1], proxied.samples[-1]  # the 20% mark and the end
        growth = (last.rss_mib - early.rss_mib) / early.rss_mib
        if growth >= RSS_GROWTH_LIMIT:
            problems.append(f"proxy RSS grew {growth:.1%} between {early.calls} and {last.calls} calls")
        if last.fds > early.fds:
            problems.append(f"proxy file descriptors grew from {early.fds} to {last.fds}")
    else:
        problems.append("too few samples of the proxy")
    return problems


def render(results: dict[str, Any]) -> str:
    lines = []
    for name in ("direct", "proxy"):
        phase: Phase = results[name]
        rate = phase.calls / phase.seconds if phase.seconds else 0.0
        errors = ", ".join(f"{m}/{c}: {n}" for (m, c), n in sorted(phase.errors.items())) or "none"
        lines.append(f"{name:7s} {phase.calls:7d} calls in {phase.seconds:7.1f} s ({rate:6.0f}/s); errors: {errors}")
        lines += [f"        e.g. {s}" for s in phase.error_samples[:3]]
    lines.append("proxy   calls     RSS MiB   open fds")
    for s in results["proxy"].samples:
        lines.append(f"        {s.calls:7d}   {s.rss_mib:8.1f}   {s.fds:8d}")
    samples = results["proxy"].samples
    if len(samples) >= 2:
        growth = (samples[-1].rss_mib - samples[1].rss_mib) / samples[1].rss_mib
        lines.append(f"RSS growth from the 20% mark to the end: {growth:+.1%} (limit {RSS_GROWTH_LIMIT:.0%}); "
                     f"fds {samples[1].fds} -> {samples[-1].fds}")
    lines.append("verdict: " + ("; ".join(results["problems"]) if results["problems"] else "ok"))
    return "\n".join(lines)


async def soak(opts: SoakOptions) -> dict[str, Any]:
    with work_dir("rps-", opts.keep) as work:
        async with contextlib.AsyncExitStack() as stack:
            say(f"soak: work directory {work}")
            ctd = LocalContainerd(work / "ctd", log_level="warn")
            await ctd.start(timeout=120)
            stack.push_async_callback(ctd.stop, 60)
            hook = HookServerChild(work / "hook.sock", work / "hookserver.log")
            await hook.start()
            stack.push_async_callback(hook.stop)
            await hook.wait_ready()
            hook_dir = work / "hooks.d"
            hook_dir.mkdir(mode=0o755)
            write_hook_config(hook_dir, "noop", hook.sock, ALL_HOOKS, failure_policy="Ignore")
            proxy = ProxyChild("proxy", work / "proxy.sock", ctd.socket, hook_dir, work / "proxy.log")
            await proxy.start()
            stack.push_async_callback(proxy.stop)
            await wait_cri_version(proxy.listen, proxy)

            direct_channel = await stack.enter_async_context(aio.insecure_channel(ctd.address))
            proxy_channel = await stack.enter_async_context(aio.insecure_channel(grpc_target(proxy.listen)))
            direct = v1_grpc.RuntimeServiceStub(direct_channel)
            logs = work / "podlogs"
            pods, containers = await fixture(direct, logs)
            await wait_idle(proxy.pid)
            say(f"soak: {opts.direct_calls} calls straight at containerd, concurrency {opts.concurrency}")
            direct_phase = await drive(Mix(direct, direct, pods, containers, logs), opts.direct_calls,
                                       opts.concurrency, None)
            say(f"soak: {opts.calls} calls through the proxy (pid {proxy.pid})")
            proxied = v1_grpc.RuntimeServiceStub(proxy_channel)
            proxy_phase = await drive(Mix(proxied, direct, pods, containers, logs), opts.calls,
                                      opts.concurrency, proxy.pid)
            problems = verdict(direct_phase, proxy_phase, proxy.alive)
            say("soak: cleaning up")
        return {"direct": direct_phase, "proxy": proxy_phase, "problems": problems}


def parse(argv: list[str]) -> SoakOptions:
    d = SoakOptions()
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=d.calls, help=f"CRI calls through the proxy [{d.calls}]")
    p.add_argument("--direct-calls", type=int, default=d.direct_calls,
                   help=f"CRI calls straight at containerd first [{d.direct_calls}]")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help=f"concurrent clients [{d.concurrency}]")
    p.add_argument("--quick", action="store_true", help="5,000 calls through the proxy, 1,000 direct")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs of every process)")
    a = p.parse_args(argv)
    if a.calls < 10 or a.direct_calls < 1 or a.concurrency < 1:
        p.error("--calls must be >= 10, --direct-calls and --concurrency >= 1")
    opts = SoakOptions(calls=a.calls, direct_calls=a.direct_calls, concurrency=a.concurrency, keep=a.keep)
    return quick(opts) if a.quick else opts


def main(argv: list[str]) -> int:
    opts = parse(argv)
    try:
        results = asyncio.run(soak(opts))
    except KeyboardInterrupt:
        print("bench soak: interrupted; everything was stopped", file=sys.stderr)
        return 130
    except (BenchError, RuntimeError) as exc:  # containerd or a child that would not start
        print(f"bench soak: {exc}", file=sys.stderr)
        return 1
    print(render(results))
    return 1 if results["problems"] else 0
