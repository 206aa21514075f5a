"""The tree passes ruff with the rules pyproject.toml selects ([tool.ruff]):
unused imports and variables, undefined names, bugbear's findings and the
like, which no other test catches until the line runs; and mypy's type check
of the packages [tool.mypy] names (a None passed on, a wrong message type):
runtimeproxy/, hooks/, bench/ and the support modules of tests/ (not test_*.py)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ..prerequisites import fail_or_skip

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is None:
        fail_or_skip("no ruff (pip install -e '.[test]')")
    # --no-cache: nothing written into the checkout; the config is the tree's own pyproject.toml.
    return [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]


def test_the_tree_is_lint_clean(ruff: list[str]) -> None:
    done = subprocess.run([*ruff, str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


def test_the_config_reports_what_it_selects(ruff: list[str]) -> None:
    """The check above is not vacuous: a module of the tree with an unused
    import and a loop variable a closure reads late fails it."""
    source = "import os\n\nfns = []\nfor i in range(3):\n    fns.append(lambda: i)\n"
    done = subprocess.run(
        [*ruff, "--stdin-filename", str(ROOT / "runtimeproxy" / "linted.py"), "-"],
        cwd=ROOT, input=source, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "F401" in done.stdout and "B023" in done.stdout, done.stdout


@pytest.fixture(scope="module")
def mypy(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    if importlib.util.find_spec("mypy") is None:
        fail_or_skip("no mypy (pip install -e '.[test]')")
    # A cache of this module's own, outside the checkout: the second run reads
    # the modules the first one checked (stdlib, protobuf's stubs) from it.
    cache = tmp_path_factory.mktemp("mypy-cache")
    return [sys.executable, "-m", "mypy", f"--cache-dir={cache}", "--no-error-summary"]


def test_the_tree_type_checks(mypy: list[str]) -> None:
    done = subprocess.run(mypy, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}{done.stderr}"


def test_the_type_check_reads_the_generated_stubs(mypy: list[str], tmp_path: Path) -> None:
    """The check above is not vacuous: with protoc's stubs (cri_api/*_pb2.pyi)
    a message field given a wrong type is found (without them, every
    message name would be unknown to mypy)."""
    probe = tmp_path / "probe.py"  # (a file: mypy takes no -c with the config's packages)
    probe.write_text("from cri_api.v1 import api_pb2\n\napi_pb2.VersionRequest(version=1)\n")
    done = subprocess.run([*mypy, str(probe)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[arg-type]" in done.stdout and "[attr-defined]" not in done.stdout, done.stdout


def test_the_type_check_covers_bench_and_the_tests_support_modules() -> None:
    """[tool.mypy] checks bench/ and every module of tests/ but the test_*.py
    ones, and no support module imports a test module (mypy would follow the
    import and check that test module too)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert {"runtimeproxy", "hooks", "bench", "tests"} <= set(config["packages"]), config["packages"]
    excluded = re.compile(config["exclude"])
    support = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").rglob("*.py"))
               if not p.name.startswith("test_")]
    assert "tests/unit/hookpath/registrydir.py" in support and "tests/conftest.py" in support
    assert not [path for path in support if excluded.search(path)]
    assert excluded.search("tests/unit/test_lint.py") and excluded.search("tests/component/nri/test_plugin.py")
    assert not [p for p in (ROOT / "bench").rglob("*.py") if excluded.search(p.relative_to(ROOT).as_posix())]
    importing = re.compile(r"^\s*(?:from\s+[.\w]*\btest_\w*\s+import|import\s+[.\w]*\btest_|from\s+\.+\s+import\s.*\btest_)",
                           re.MULTILINE)
    assert not [path for path in support if importing.search((ROOT / path).read_text())]
