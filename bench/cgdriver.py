"""The proxy under callgrind (or cProfile) behind a fake runtime, driven phase by phase (``bench callgrind``).

``serving`` starts the fake runtime (bench/fakeruntime.py), the SDK's no-op
hook server (as the bench runs it) registered on all seven hook points, and
the proxy as the bench's hooked proxies run (``--log-level warning``,
``--metrics-listen``), its command line wrapped (valgrind, a profiler).
``measure`` dumps callgrind's counts at the end of each phase, once the
proxy is idle: start-up, an idle spell, lifecycles, then the lifecycle's
calls one kind at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpc import aio

from cri_api.v1 import api_pb2 as v1
from cri_api.v1 import api_pb2_grpc as v1_grpc
from hooks.sdk import write_hook_config
from runtimeproxy.host.unixsocket import grpc_target

from . import lifecycle as lc
from .fakeruntime import FakeRuntime
from .procs import BenchError, HookServerChild, ProxyChild, free_tcp_port, wait_cri_version, wait_idle
from .proxymetrics import ALL_HOOKS

# valgrind reads callgrind_control's commands only while the proxy runs: a call wakes it.
POKE_S = 0.5
# The proxy under cProfile, switched on by SIGUSR1 and off (its stats written) by SIGUSR2.
_PROFILED = """import cProfile, signal, sys
profile = cProfile.Profile()
path = sys.argv.pop(1)
def stop(*_):
    profile.disable()
    profile.dump_stats(path)
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, stop)
from runtimeproxy.cli import main
sys.exit(main(prog_name='runtime-proxy'))
"""


@dataclass
class Phase:
    instructions: int
    gc: int  # of them, the cyclic collector's
    seconds: float = 0.0  # wall time, from the dump before
    idle: float = 0.0  # of the instructions, what the proxy spends idle in that time (estimated)

    @property
    def net(self) -> float:
        return self.instructions - self.idle


@dataclass
class Run:
    """One proxy process's phases, by name."""

    phases: dict[str, Phase] = field(default_factory=dict)
    hash_seed: int | None = None  # the proxy's PYTHONHASHSEED
    work: Path | None = None  # its dumps and log


def callgrind_argv(argv: list[str], out: Path, hash_seed: int) -> list[str]:
    """The proxy's command line under callgrind, its string hashes seeded with
    ``hash_seed`` (``env`` execs valgrind: the pid stays the child's)."""
    return ["env", f"PYTHONHASHSEED={hash_seed}", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]


@dataclass
class Serving:
    proxy: ProxyChild
    stub: v1_grpc.RuntimeServiceStub  # through the proxy
    direct: v1_grpc.RuntimeServiceStub  # straight to the fake runtime (clean-up)
    logs: Path  # the pods' log directory (named in their configs only)


Settle = Callable[[], Awaitable[Phase]]
Wrap = Callable[[list[str]], list[str]]


@contextlib.asynccontextmanager
async def serving(work: Path, wrap: Wrap, hooks: bool = True) -> AsyncIterator[Serving]:
    """The fake runtime, the hook server (registered unless not ``hooks``) and
    the proxy, its command line through ``wrap``; all stopped on the way out."""
    runtime = FakeRuntime(work / "rt.sock")
    await runtime.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(runtime.stop)
        hook = HookServerChild(work / "hook.sock", work / "hookserver.log", "sdk")
        await hook.start()
        stack.push_async_callback(hook.stop)
        await hook.wait_ready()
        hook_dir = work / "hooks"
        hook_dir.mkdir(mode=0o755)
        if hooks:
            write_hook_config(hook_dir, "noop", hook.sock, ALL_HOOKS, failure_policy="Ignore")
        proxy = ProxyChild("proxy", work / "proxy.sock", runtime.socket, hook_dir, work / "proxy.log",
                           metrics_port=free_tcp_port())
        proxy.argv = wrap(proxy.argv)
        await proxy.start()
        stack.push_async_callback(proxy.stop, 60.0)
        await wait_cri_version(proxy.listen, proxy, timeout=600)  # under valgrind start-up takes a minute
        channel = await stack.enter_async_context(aio.insecure_channel(grpc_target(proxy.listen)))
        direct = await stack.enter_async_context(aio.insecure_channel(grpc_target(runtime.socket)))
        yield Serving(proxy, v1_grpc.RuntimeServiceStub(channel), v1_grpc.RuntimeServiceStub(direct), work / "podlogs")
        if not proxy.alive:
            raise proxy.died()
        if runtime.calls.get("RemovePodSandbox", 0) == 0:
            raise BenchError("no lifecycle reached the runtime")


async def lifecycles(serving: Serving, count: int, prefix: str) -> None:
    """``count`` of the bench's pod lifecycles (bench/lifecycle.py), one after the other."""
    for i in range(count):
        await lc.lifecycle(serving.stub, serving.direct, serving.logs, f"{prefix}{i}")


async def by_call(serving: Serving, count: int, settle: Settle) -> dict[str, Phase]:
    """``count`` pods taken through the lifecycle one call kind at a time (each
    call as bench/lifecycle.py makes it): a phase per kind."""
    stub = serving.stub
    pods = [lc.bench_pod_config(serving.logs, f"bycall{i}") for i in range(count)]
    pod_ids: list[str] = []
    cids: list[str] = []
    calls: dict[str, Callable[[int], Awaitable[object]]] = {
        "RunPodSandbox": lambda i: stub.RunPodSandbox(v1.RunPodSandboxRequest(config=pods[i])),
        "CreateContainer": lambda i: stub.CreateContainer(v1.CreateContainerRequest(
            pod_sandbox_id=pod_ids[i], config=lc.bench_container_config("sleeper"), sandbox_config=pods[i])),
        "StartContainer": lambda i: stub.StartContainer(v1.StartContainerRequest(container_id=cids[i])),
        "StopContainer": lambda i: stub.StopContainer(v1.StopContainerRequest(container_id=cids[i], timeout=10)),
        "RemoveContainer": lambda i: stub.RemoveContainer(v1.RemoveContainerRequest(container_id=cids[i])),
        "StopPodSandbox": lambda i: stub.StopPodSandbox(v1.StopPodSandboxRequest(pod_sandbox_id=pod_ids[i])),
        "RemovePodSandbox": lambda i: stub.RemovePodSandbox(v1.RemovePodSandboxRequest(pod_sandbox_id=pod_ids[i])),
    }
    out: dict[str, Phase] = {}
    for step in lc.STEPS:
        for i in range(count):
            answer = await calls[step](i)
            if step == "RunPodSandbox":
                assert isinstance(answer, v1.RunPodSandboxResponse), answer
                pod_ids.append(answer.pod_sandbox_id)
            elif step == "CreateContainer":
                assert isinstance(answer, v1.CreateContainerResponse), answer
                cids.append(answer.container_id)
        out[step] = await settle()
    return out


async def dump(pid: int, poke: v1_grpc.RuntimeServiceStub) -> None:
    """A callgrind dump of the proxy, which then counts from zero."""
    control = await asyncio.create_subprocess_exec(
        "callgrind_control", "-d", str(pid), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    waiting = asyncio.ensure_future(control.wait())
    while not (await asyncio.wait({waiting}, timeout=POKE_S))[0]:
        with contextlib.suppress(aio.AioRpcError):
            await poke.Version(v1.VersionRequest(), timeout=30)
    if waiting.result() != 0:
        raise BenchError(f"callgrind_control -d {pid} failed ({waiting.result()})")


def read_dump(path: Path) -> Phase:
    """A dump's total instructions, and the collector's: ``gc_collect_main``
    inclusive, its own lines and its calls' (each call line's cost is its callee's, inclusive)."""
    total: int | None = None
    gc = 0
    names: dict[str, str] = {}
    in_gc = False
    with path.open(errors="replace") as lines:
        for line in lines:
            if line.startswith(("fn=", "cfn=")):
                ref, _, name = line.split("=", 1)[1].strip().partition(" ")
                if name:
                    names[ref] = name  # (name compression: "(id) name" once, "(id)" after)
                if line.startswith("fn="):
                    in_gc = names.get(ref, ref).split("'")[0] == "gc_collect_main"
            elif in_gc and (line[:1].isdigit() or line[:1] in "+-*"):
                gc += int(line.split()[1])
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split(":")[1])
    if total is None:
        raise BenchError(f"no totals in {path}")
    return Phase(total, gc)


async def measure(work: Path, count: int, warmup: int, idle: float, hash_seed: int, hooks: bool = True) -> Run:
    """One proxy process under callgrind, phase by phase, its PYTHONHASHSEED ``hash_seed``."""
    run = Run(hash_seed=hash_seed, work=work)
    out = work / "callgrind.out"

    async with serving(work, lambda argv: callgrind_argv(argv, out, hash_seed), hooks) as s:
        loop = asyncio.get_running_loop()
        dumps = 0
        last = loop.time()
        rate = 0.0  # instructions per second while idle

        async def settle() -> Phase:
            nonlocal dumps, last
            await wait_idle(s.proxy.pid, quiet_for=1.0, timeout=120)  # its post hooks done
            await dump(s.proxy.pid, s.stub)
            dumps += 1
            phase = read_dump(Path(f"{out}.{dumps}"))
            phase.seconds, last = loop.time() - last, loop.time()
            phase.idle = rate * phase.seconds
            return phase

        await lifecycles(s, warmup, "warm")
        run.phases["start-up"] = await settle()
        # What the proxy does by the clock, not per call (its hook directory's periodic rescan).
        await asyncio.sleep(idle)
        run.phases["idle"] = await settle()
        rate = run.phases["idle"].instructions / run.phases["idle"].seconds
        for phase in ("lifecycles", "lifecycles again"):
            await lifecycles(s, count, phase[-5:])
            run.phases[phase] = await settle()
        run.phases.update(await by_call(s, count, settle))
    return run


async def profile(work: Path, count: int, warmup: int, path: Path, hooks: bool = True) -> None:
    """One proxy process under cProfile for ``count`` lifecycles after the warm-up; pstats to ``path``."""

    def wrap(argv: list[str]) -> list[str]:
        i = argv.index("-c")  # the proxy's own entry, replaced by the profiled one
        return [*argv[:i], "-c", _PROFILED, str(path.resolve()), *argv[i + 2:]]

    async with serving(work, wrap, hooks) as s:
        await lifecycles(s, warmup, "warm")
        await wait_idle(s.proxy.pid)
        os.kill(s.proxy.pid, signal.SIGUSR1)
        await lifecycles(s, count, "prof")
        await wait_idle(s.proxy.pid)
        os.kill(s.proxy.pid, signal.SIGUSR2)
        while not path.exists():  # noqa: ASYNC240 - the handler runs at the proxy's next bytecode: a call wakes it; a stat, not the measured path
            await s.stub.Version(v1.VersionRequest(), timeout=30)
            await asyncio.sleep(POKE_S)
