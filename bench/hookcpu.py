"""Instructions per hook call of a no-op hook server, counted by callgrind.

    python -m bench.hookcpu [--calls N] [--repeats R] [--server sdk|lean] [--event-loop LOOP] [--interleaved]
    python -m bench.hookcpu --profile OUT.prof [--calls N]    # cProfile instead, no valgrind

A hook server's CPU is taken from containerd and the proxy while a pod
starts, and on a noisy 2-core machine seconds of CPU move more than the cuts
being judged; instructions do not. The hook server the bench runs
(``bench/procs.py``: ``python -m hooks.testserver --config {}``, or
``bench.leanhook``) is started under ``valgrind --tool=callgrind``, and this
process calls it as the proxy does: the proxy's own HTTP/2 client
(``runtimeproxy.hookclient``), one connection, one call at a time, with the
requests a bench lifecycle makes at each of the seven hook points. Per kind,
the counters are zeroed, N calls made and dumped, then zeroed again and 2N
made (``callgrind_control``): (I(2N) - I(N)) / N is what a call costs the
server once started, without its start-up or the cost of the dumps
themselves. The median of ``--repeats`` servers is printed, per kind.
With ``--interleaved`` the calls go as a lifecycle makes them, the six
kinds of a bench lifecycle in turn (the methods, so the header blocks,
alternating on the connection), and what is counted is N such lifecycles.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import Message

from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType
from runtimeproxy.hookpath.store import container_record, pod_record

from . import lifecycle as lc
from .cgdriver import read_dump

SERVERS = {
    "sdk": ["-m", "hooks.testserver", "--config", "{}", "--socket"],
    "lean": ["-m", "bench.leanhook"],
}
TIMEOUT_S = 2.0  # a hook file's default timeout: the grpc-timeout the proxy sends
WARMUP_CALLS = 30  # per kind, before any count: imports, first-call caches
CONTAINER_ID = "3f4a" * 16  # containerd's ids: 64 hex digits
# A bench lifecycle's hook calls in the order it makes them (it updates no resources).
LIFECYCLE = (HookType.PRE_RUN_POD_SANDBOX, HookType.PRE_CREATE_CONTAINER, HookType.PRE_START_CONTAINER,
             HookType.POST_START_CONTAINER, HookType.POST_STOP_CONTAINER, HookType.POST_STOP_POD_SANDBOX)


@dataclass(frozen=True)
class Sample:
    kind: HookType | None  # None: a whole lifecycle, its calls interleaved
    per_call: float  # instructions, per call of the kind or per lifecycle


def requests(log_dir: Path) -> dict[HookType, bytes]:
    """The seven hook requests of a bench lifecycle, as the proxy builds them (hookpath/podexecutors.py, containerexecutors.py)."""
    pod = pod_record(lc.bench_pod_config(log_dir, "hookcpu"))
    config = lc.bench_container_config("sleeper")
    created = container_record(pod, config)  # PreCreateContainer: no id yet
    stored = container_record(pod, config, CONTAINER_ID)
    updated = container_record(pod, config, CONTAINER_ID)
    updated.container_resources.cpu_quota = 100000  # an UpdateContainerResources' new limit
    built: dict[HookType, Message] = {
        HookType.PRE_RUN_POD_SANDBOX: pod,
        HookType.PRE_CREATE_CONTAINER: created,
        HookType.PRE_START_CONTAINER: stored,
        HookType.POST_START_CONTAINER: stored,
        HookType.PRE_UPDATE_CONTAINER_RESOURCES: updated,
        HookType.POST_STOP_CONTAINER: stored,
        HookType.POST_STOP_POD_SANDBOX: pod,
    }
    return {hook: message.SerializeToString() for hook, message in built.items()}


async def _calls(transport: FramesTransport, sock: Path, hook: HookType, request: bytes, n: int) -> None:
    method = HOOK_POINTS[hook].full_method
    for _ in range(n):
        await transport.call(str(sock), method, request, TIMEOUT_S, owner_uid=None)


async def _lifecycles(transport: FramesTransport, sock: Path, reqs: dict[HookType, bytes], n: int) -> None:
    for _ in range(n):
        for hook in LIFECYCLE:
            await transport.call(str(sock), HOOK_POINTS[hook].full_method, reqs[hook], TIMEOUT_S, owner_uid=None)


def _start(server: str, sock: Path, out: Path, event_loop: str, profile: Path | None) -> subprocess.Popen[str]:
    args = [*SERVERS[server], str(sock)]
    if server == "sdk":
        args = [*args, "--event-loop", event_loop]
    if profile is not None:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), *args]
    else:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
               "--vgdb=yes", sys.executable, *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"hook server did not start: {' '.join(cmd)}")
    return proc


def _control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def _last_dump(work: Path, seen: set[Path]) -> Path:
    new = [p for p in work.glob("cg.out*") if p not in seen and p.stat().st_size]
    if len(new) != 1:
        raise RuntimeError(f"expected one new callgrind dump, found {new}")
    seen.add(new[0])
    return new[0]


Batch = Callable[[int], Awaitable[None]]  # makes n calls (or n lifecycles)


async def _measure(work: Path, pid: int, batches: dict[HookType | None, Batch], n: int,
                   keep: Path | None) -> list[Sample]:
    seen: set[Path] = set()
    samples = []
    for kind, batch in batches.items():
        counts = []
        for calls in (n, 2 * n):
            await asyncio.to_thread(_control, "-z", pid)
            await batch(calls)
            await asyncio.to_thread(_control, "-d", pid)
            dump = _last_dump(work, seen)
            counts.append(read_dump(dump).instructions)
            if keep is not None:  # for callgrind_annotate
                name = "lifecycle" if kind is None else kind.value
                shutil.copy(dump, keep / f"{name}.{calls}.callgrind")
        samples.append(Sample(kind, (counts[1] - counts[0]) / n))
    return samples


def _batch(transport: FramesTransport, sock: Path, hook: HookType, request: bytes) -> Batch:
    # A closure per hook point (a lambda in the comprehension would call the last one's).
    return lambda n: _calls(transport, sock, hook, request, n)


async def _one_server(server: str, n: int, event_loop: str, profile: Path | None,
                      keep: Path | None = None, interleaved: bool = False) -> list[Sample]:
    with tempfile.TemporaryDirectory(prefix="hookcpu-") as tmp:
        work = Path(tmp)
        sock = work / "hook.sock"
        reqs = requests(work)
        proc = await asyncio.to_thread(_start, server, sock, work / "cg.out", event_loop, profile)
        transport = FramesTransport()
        try:
            for hook, request in reqs.items():
                await _calls(transport, sock, hook, request, WARMUP_CALLS)
            batches: dict[HookType | None, Batch] = (
                {None: lambda k: _lifecycles(transport, sock, reqs, k)} if interleaved else
                {hook: _batch(transport, sock, hook, request) for hook, request in reqs.items()})
            if profile is not None:
                for batch in batches.values():
                    await batch(n)
                return []
            return await _measure(work, proc.pid, batches, n, keep)
        finally:
            await transport.close(1.0)
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hookcpu", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="N: calls per kind in the first phase [200]")
    parser.add_argument("--repeats", type=int, default=3, help="servers started, each measured once [3]")
    parser.add_argument("--server", choices=tuple(SERVERS), default="sdk", help="the bench's no-op hook server [sdk]")
    parser.add_argument("--event-loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                        help="the SDK server's loop [auto: uvloop, as the bench runs it]")
    parser.add_argument("--profile", type=Path, help="run the server under cProfile, write its stats here")
    parser.add_argument("--keep", type=Path, help="copy the last server's dumps into this directory")
    parser.add_argument("--interleaved", action="store_true",
                        help="N lifecycles, their six calls in turn, rather than N calls of each kind in a row")
    args = parser.parse_args(argv)
    if args.profile is not None:
        asyncio.run(_one_server(args.server, args.calls, args.event_loop, args.profile.absolute(),
                                interleaved=args.interleaved))
        print(f"cProfile stats written to {args.profile}")
        return 0
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    runs = [asyncio.run(_one_server(args.server, args.calls, args.event_loop, None,
                                    args.keep if i == args.repeats - 1 else None, args.interleaved))
            for i in range(args.repeats)]
    if args.interleaved:
        values = [run[0].per_call for run in runs]
        shown = ", ".join(f"{v / 1000:.1f}k" for v in values)
        print(f"{args.server} hook server ({args.event_loop} loop), instructions per lifecycle, its six calls "
              f"interleaved, median of {args.repeats} (N={args.calls}):")
        print(f"  {'a lifecycle (interleaved)':<28} {statistics.median(values) / 1000:7.1f}k   ({shown})")
        print(f"  {'per call':<28} {statistics.median(values) / len(LIFECYCLE) / 1000:7.1f}k")
        return 0
    print(f"{args.server} hook server ({args.event_loop} loop), instructions per call, "
          f"median of {args.repeats} (N={args.calls}):")
    medians: dict[HookType, float] = {}
    for hook in [sample.kind for sample in runs[0]]:
        assert hook is not None  # (None: --interleaved's lifecycle sample, shown and returned above)
        values = [next(s.per_call for s in run if s.kind is hook) for run in runs]
        medians[hook] = statistics.median(values)
        shown = ", ".join(f"{v / 1000:.1f}k" for v in values)
        print(f"  {hook.value:<28} {medians[hook] / 1000:7.1f}k   ({shown})")
    print(f"  {'mean of the seven':<28} {statistics.mean(medians.values()) / 1000:7.1f}k")
    # What the server spends on one of the bench's pod lifecycles, which updates no resources.
    lifecycle = sum(v for hook, v in medians.items() if hook is not HookType.PRE_UPDATE_CONTAINER_RESOURCES)
    print(f"  {'a lifecycle (all but update)':<28} {lifecycle / 1000:7.1f}k")
    return 0


if __name__ == "__main__":
    sys.exit(main())
