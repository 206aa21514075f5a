"""GRPC_ENABLE_FORK_SUPPORT is the command's setting, made before grpc's
import, not the package's: importing runtimeproxy set it for a library user
and every child of theirs, and only when it came before grpc's import."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    env = {name: value for name, value in os.environ.items() if name != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_package_leaves_the_environment_alone() -> None:
    code = "import os, runtimeproxy.cli; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))"
    assert _run(code) == "None"


def test_the_entry_point_turns_grpc_fork_handlers_off_before_grpc_is_imported() -> None:
    code = (
        "import os, sys, builtins\n"
        "real = builtins.__import__\n"
        "seen = []\n"
        "def spy(name, *args, **kwargs):\n"
        "    if name == 'grpc' and not seen:\n"
        "        seen.append(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = spy\n"
        "from runtimeproxy.entry import main\n"
        "print(seen[0], os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    )
    assert _run(code) == "false false"


def test_the_console_script_and_python_m_use_the_entry_point() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"runtime-proxy": "runtimeproxy.entry:main"}
    assert "from .entry import main" in (REPO / "runtimeproxy" / "__main__.py").read_text()
