"""``python -m bench callgrind [--lifecycles N] [--runs R] [--no-hooks] [--profile PATH]``: the proxy's instructions per pod lifecycle.

The proxy (``runtime-proxy serve`` on its default data path) runs under
``valgrind --tool=callgrind``, which counts the instructions it executes:
unlike CPU seconds, the count repeats on a busy machine. In front of it a
fake runtime in this process (bench/fakeruntime.py) answers every call at
once; the SDK's no-op hook server is registered on all seven hook points
(failure policy Ignore), as in the bench's proxy+hook mode. This process
drives the bench's pod lifecycle through the proxy (bench/lifecycle.py: the
same seven calls, the same requests). No root, no containerd.

Each run is one proxy process, its phases each ended by a callgrind dump
once it is idle (bench/cgdriver.py): start-up with ``--warmup`` lifecycles;
``--idle`` seconds of nothing, which measure what it does by the clock (its
hook directory's periodic rescan) to take out of the other phases as
``idle``; ``--lifecycles`` lifecycles, twice; then as many pods taken through
the lifecycle call by call (every pod's RunPodSandbox, then every pod's
CreateContainer, ...), which gives each call kind's part. ``gc``: the cyclic
collector's part, counted in whichever phase it ran.

Each run's proxy gets a PYTHONHASHSEED of its own (``--hash-seed`` for one
seed in every run), named as it starts. A run whose lifecycle is
``OUTLIER_RATIO`` above the lowest run's is named after the report, with its
seed, and its work directory (dumps, the proxy's log) kept: runs 70% above
the others, every call kind alike, came now and then, not reproduced by
their seeds (docs/performance.md).

``--profile PATH`` runs the proxy without valgrind under cProfile instead,
enabled for ``--lifecycles`` lifecycles after the warm-up, and writes its
pstats to PATH (Python functions, which callgrind does not tell apart).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import statistics
import sys
from pathlib import Path

from . import lifecycle as lc
from .cgdriver import Phase, Run, measure, profile
from .procs import say, work_dir

# A run this much above the lowest run, per lifecycle, is named and its work directory kept.
OUTLIER_RATIO = 1.1


def joined(*phases: Phase) -> Phase:
    return Phase(sum(p.instructions for p in phases), sum(p.gc for p in phases), sum(p.seconds for p in phases),
                 sum(p.idle for p in phases))


def summary(runs: list[Run]) -> dict[str, list[Phase]]:
    """Each phase across runs; "lifecycle": both lifecycle phases, "sum of the calls": every kind's."""
    out = {name: [r.phases[name] for r in runs] for name in runs[0].phases}
    out["lifecycle"] = [joined(r.phases["lifecycles"], r.phases["lifecycles again"]) for r in runs]
    out["sum of the calls"] = [joined(*(r.phases[step] for step in lc.STEPS)) for r in runs]
    return out


def _row(name: str, phases: list[Phase], per: int) -> str:
    def median(values: list[float]) -> float:
        return statistics.median(values) / per / 1e6

    nets = [p.net for p in phases]
    each = " ".join(f"{v / per / 1e6:.3f}" for v in nets)
    return (f"  {name:22s} {median(nets):9.3f} {median([p.instructions for p in phases]):9.3f} "
            f"{median([p.gc for p in phases]):7.3f} {median([p.idle for p in phases]):7.3f}   {each}")


def report(runs: list[Run], count: int) -> str:
    s = summary(runs)
    rate = statistics.median(p.instructions / p.seconds for p in s["idle"]) / 1e6
    lines = [
        f"the proxy's instructions in millions, median of {len(runs)} run(s): net = raw - idle, idle = "
        f"{rate:.3f}M a second x the phase's wall time; gc: the cyclic collector's part of raw",
        f"  {'':22s} {'net':>9s} {'raw':>9s} {'gc':>7s} {'idle':>7s}   net per run",
        _row("start-up, in all", s["start-up"], 1),
        _row(f"per lifecycle ({2 * count})", s["lifecycle"], 2 * count),
        _row(f"  the first {count}", s["lifecycles"], count),
        _row(f"  the next {count}", s["lifecycles again"], count),
        f"  per call ({count} pods taken through the lifecycle call by call):",
    ]
    lines += [_row(f"  {step}", s[step], count) for step in lc.STEPS]
    lines.append(_row("  the seven together", s["sum of the calls"], count))
    return "\n".join(lines)


def outliers(runs: list[Run], count: int) -> dict[int, str]:
    """Each run ``OUTLIER_RATIO`` above the lowest run per lifecycle (net), by index: a line on it."""
    nets = [p.net / (2 * count) / 1e6 for p in summary(runs)["lifecycle"]]
    low = min(nets)
    return {i: f"outlier: run {i + 1}, {net:.3f} M a lifecycle against {low:.3f} M (PYTHONHASHSEED={run.hash_seed}; "
               f"its dumps and log kept in {run.work})"
            for i, (run, net) in enumerate(zip(runs, nets, strict=True)) if net > low * OUTLIER_RATIO}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench callgrind", description=__doc__.split("\n\n")[0])
    p.add_argument("--lifecycles", type=int, default=40, help="lifecycles per measured phase [40]")
    p.add_argument("--warmup", type=int, default=3, help="lifecycles in the start-up phase [3]")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of the idle phase [10]")
    p.add_argument("--runs", type=int, default=3, help="proxy processes, one after the other; medians shown [3]")
    p.add_argument("--no-hooks", action="store_true", help="register no hook server (the proxy mode of the bench)")
    p.add_argument("--profile", type=Path, help="instead: cProfile one phase, no valgrind; pstats to this file")
    p.add_argument("--keep", action="store_true", help="keep the work directories (callgrind files, logs)")
    p.add_argument("--hash-seed", type=int, help="the proxy's PYTHONHASHSEED in every run [a random one each run]")
    a = p.parse_args(argv)
    if a.lifecycles < 1 or a.warmup < 1 or a.runs < 1 or a.idle <= 0:
        p.error("--lifecycles, --warmup and --runs must be >= 1, --idle > 0")
    if a.hash_seed is not None and not 0 <= a.hash_seed <= 4294967295:
        p.error("--hash-seed must be in 0..4294967295 (PYTHONHASHSEED's range)")
    hooks = not a.no_hooks
    if a.profile is not None:
        with work_dir("rpb-prof-", a.keep) as work:
            asyncio.run(profile(work, a.lifecycles, a.warmup, a.profile, hooks))
        say(f"pstats written to {a.profile}")
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench callgrind: needs valgrind (Debian: valgrind)", file=sys.stderr)
        return 2
    runs: list[Run] = []
    odd: dict[int, str] = {}
    try:
        for r in range(a.runs):
            seed = random.randrange(4294967296) if a.hash_seed is None else a.hash_seed
            work = Path(tempfile.mkdtemp(prefix="rpb-cg-", dir="/tmp"))
            runs.append(Run(hash_seed=seed, work=work))  # its directory removed at the end unless kept
            say(f"run {r + 1} of {a.runs}: the proxy under callgrind in {work}, PYTHONHASHSEED={seed}")
            runs[-1] = asyncio.run(measure(work, a.lifecycles, a.warmup, a.idle, seed, hooks))
        print(report(runs, a.lifecycles))
        odd = outliers(runs, a.lifecycles)
        for line in odd.values():
            print(line)
    finally:
        for i, run in enumerate(runs):
            assert run.work is not None
            if a.keep or i in odd:
                say(f"kept {run.work}")
            else:
                shutil.rmtree(run.work, ignore_errors=True)
    return 0
