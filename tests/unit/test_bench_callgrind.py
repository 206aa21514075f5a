"""bench callgrind's figures (bench/callgrind.py, bench/cgdriver.py) from hand-made callgrind dumps (no valgrind run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import callgrind, cgdiff
from bench.cgdriver import Phase, Run, callgrind_argv, read_dump
from bench.lifecycle import STEPS
from bench.procs import BenchError

# A dump as callgrind writes one (name compression, relative positions, call
# lines whose cost is the callee's inclusive one), gc_collect_main's block
# twice: once named, once by its id alone, with a recursion suffix.
DUMP = """# callgrind format
version: 1
positions: line
events: Ir
summary: 10000

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(3) Modules/gcmodule.c
fn=(7) gc_collect_main
1181 500
+10 80
cfl=(3)
cfn=(8) visit_reachable
calls=12 340
* 300
fn=(8)
340 290
fn=(9) _PyEval_EvalFrameDefault
20 5000
calls=1 1181
+3 880
fn=(7)
-4 20
fn=(10) gc_collect_main'2
5 100
"""


def test_a_dump_gives_its_total_and_the_collectors_part_inclusive(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out.1"
    path.write_text(DUMP)
    phase = read_dump(path)
    assert phase.instructions == 10000
    # Its own lines (500 + 80 + 20 + 100) and its callee's inclusive cost (300);
    # not the caller's line for the call into it (880), nor the callee's own block (290).
    assert phase.gc == 1000


def test_a_dump_without_totals_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out.1"
    path.write_text("# callgrind format\nevents: Ir\n")
    with pytest.raises(BenchError):
        read_dump(path)


def _run(scale: float) -> Run:
    phases = {"start-up": Phase(2_000_000_000, 60_000_000, 60.0), "idle": Phase(5_000_000, 0, 10.0)}
    phases["lifecycles"] = Phase(int(240e6 * scale), 0, 20.0, idle=10e6)
    phases["lifecycles again"] = Phase(int(232e6 * scale), int(4e6 * scale), 20.0, idle=10e6)
    for step in STEPS:
        phases[step] = Phase(int(34e6 * scale), 0, 4.0, idle=2e6)
    return Run(phases)


def test_the_report_shows_the_median_run_per_lifecycle_and_per_call_net_of_the_idle_rate() -> None:
    out = callgrind.report([_run(1.0), _run(1.2), _run(0.9)], 40)
    rows = {line[2:24].strip(): line[24:].split() for line in out.splitlines()[2:]}  # by name: its figures
    assert "idle = 0.500M a second" in out  # 5M instructions in 10 s
    # (240 + 232 - 20) M over 80 lifecycles, the median run's; raw 472/80; gc 4/80; idle 20/80; each run's net
    assert rows["per lifecycle (80)"] == ["5.650", "5.900", "0.050", "0.250", "5.650", "6.830", "5.060"]
    assert rows["RunPodSandbox"][:2] == ["0.800", "0.850"]  # (34 - 2) and 34 M over 40
    assert rows["the seven together"][:2] == ["5.600", "5.950"]


def test_every_phase_is_in_the_report() -> None:
    out = callgrind.report([_run(1.0)], 40)
    for name in ("start-up, in all", "the first 40", "the next 40", *STEPS, "the seven together"):
        assert name in out


def test_a_run_far_above_the_lowest_is_named_with_its_seed_and_work_directory() -> None:
    runs = [_run(1.0), _run(1.7), _run(1.05)]
    for i, run in enumerate(runs):
        run.hash_seed, run.work = 100 + i, Path(f"/tmp/rpb-cg-{i}")
    odd = callgrind.outliers(runs, 40)
    assert list(odd) == [1]  # 5% above the lowest is noise, 70% is not
    assert "run 2, " in odd[1] and "PYTHONHASHSEED=101" in odd[1] and "/tmp/rpb-cg-1" in odd[1]
    assert callgrind.outliers([_run(1.0)], 40) == {}


def test_the_proxy_runs_under_callgrind_with_the_runs_hash_seed() -> None:
    argv = callgrind_argv(["python", "-c", "pass"], Path("/w/callgrind.out"), 7)
    # env execs valgrind, which runs the proxy in the same process: the pid dumps go to is the child's
    assert argv == ["env", "PYTHONHASHSEED=7", "valgrind", "--tool=callgrind", "--callgrind-out-file=/w/callgrind.out",
                    "python", "-c", "pass"]


def test_cgdiff_counts_each_functions_own_lines_across_its_recursion_levels(tmp_path: Path) -> None:
    base, other = tmp_path / "a", tmp_path / "b"
    base.write_text(DUMP)
    other.write_text(DUMP.replace("20 5000", "20 9000"))
    costs = cgdiff.self_costs(base)
    # Its own lines, gc_collect_main'2's included; neither call line (340's 300, 1181's 880)
    assert costs == {"gc_collect_main": 700, "visit_reachable": 290, "_PyEval_EvalFrameDefault": 5000}
    assert cgdiff.differences(costs, cgdiff.self_costs(other), 2) == [
        ("_PyEval_EvalFrameDefault", 5000, 9000), ("gc_collect_main", 700, 700)]
