"""``python -m bench fuzz [--examples N]``: the fault suite's fuzz tests, long and random.

CI runs ``tests/faults/test_fuzz.py`` with few examples, the same each run;
this runs it with ``--examples`` per test (default 5,000) and fresh random
examples, then prints pytest's summary. Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from .procs import PROJECT_ROOT

FUZZ_TESTS = "tests/faults/test_fuzz.py"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=5_000, help="examples per fuzz test [5000]")
    a = p.parse_args(argv)
    if a.examples < 1:
        p.error("--examples must be >= 1")
    env = os.environ | {"RUNTIME_PROXY_FUZZ_EXAMPLES": str(a.examples)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", FUZZ_TESTS, "-k", "fuzzed",
               "-o", "log_level=ERROR"]
    return subprocess.run(command, cwd=PROJECT_ROOT, env=env, check=False).returncode
