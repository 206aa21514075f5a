"""The balloons configs the docs show, copied as they are, start the hook and
reload on a node of 2 CPUs (the smallest a config with a reserved CPU fits,
and what the test machines have) and on a larger one: the example asked
for CPUs 0-15 (availableResources) and a minBalloons balloon of 2 CPUs
beside the reserved one, and `hook run` refused it on such a node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology, write_synthetic_sysfs
from hooks.cli import _load_config

ROOT = Path(__file__).resolve().parents[3]
MACHINES = {"2 CPUs": Topology.synthetic(1, 1, 2, 1), "2 nodes of 8 CPUs": Topology.synthetic(1, 2, 4, 2)}


def examples() -> list[tuple[str, str]]:
    """Each YAML block of README.md and docs/ that is a balloons config: where, and its text."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, block in enumerate(re.findall(r"^```yaml\n(.*?)^```", doc.read_text(), re.M | re.S)):
            if re.search(r"^reservedResources:", block, re.M):
                found.append((f"{doc.name}#{number}", block))
    return found


def test_the_docs_show_a_balloons_config() -> None:
    assert [where for where, _ in examples()] == ["hook-balloons.md#0"]


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize(("where", "text"), examples(), ids=[where for where, _ in examples()])
async def test_a_balloons_config_the_docs_show_starts_the_hook_and_reloads(
    tmp_path: Path, machine: str, where: str, text: str
) -> None:
    root = tmp_path / "sys"
    write_synthetic_sysfs(root, MACHINES[machine])
    path = tmp_path / "balloons.yaml"
    path.write_text(text)
    # As `hook run balloons --config` reads and builds it (hooks/cli.py): HookConfigInvalid if it does not fit.
    hook = BalloonsHook.from_config(str(tmp_path / "balloons.sock"), _load_config(path), sysfs_root=root)
    assert len(hook.state.pool.available) == len(MACHINES[machine].all_cpus)
    assert [b.name for b in hook.state.pool.balloons] == ["reserved[0]", "latency[0]"]
    assert all(b.cpus for b in hook.state.pool.balloons)
    assert await hook.reload(path)  # as the file watch reloads it: False, logged, if it did not fit
