"""The balloons configs the docs show, copied as they are, start the hook and
reload on a node of 2 CPUs (the smallest a config with a reserved CPU fits,
and what the test machines have) and on a larger one: the example asked
for CPUs 0-15 (availableResources) and a minBalloons balloon of 2 CPUs
beside the reserved one, and `hook run` refused it on such a node."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology, write_synthetic_sysfs
from hooks.cli import _load_config

ROOT = Path(__file__).resolve().parents[3]
MACHINES = {"2 CPUs": Topology.synthetic(1, 1, 2, 1), "2 nodes of 8 CPUs": Topology.synthetic(1, 2, 4, 2)}


# A fenced YAML block, indented too (in a list item), its text and closing fence as indented.
FENCE = re.compile(r"^([ \t]*)```[ \t]*(?:yaml|yml)[ \t]*\n(.*?)^\1```[ \t]*$", re.M | re.S | re.I)
# A balloons config, its keys at any indentation, or a whole BalloonsPolicy resource (its spec is read).
BALLOONS = re.compile(r"^\s*(?:reservedResources|balloonTypes)\s*:|^\s*kind\s*:\s*[\"']?BalloonsPolicy", re.M)


def examples(docs: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Each YAML block of README.md and docs/ (or ``docs``: names and texts) that is a balloons config:
    where, and its text, unindented."""
    if docs is None:
        docs = [(doc.name, doc.read_text()) for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    found = []
    for name, text in docs:
        for number, match in enumerate(FENCE.finditer(text)):
            block = textwrap.dedent(match.group(2))
            if BALLOONS.search(block):
                found.append((f"{name}#{number}", block))
    return found


def test_an_example_indented_in_yml_or_as_a_resource_is_found_too() -> None:
    """Only column-0 ```yaml blocks with a top-level reservedResources were
    found: another example would have been skipped without a word."""
    text = (
        "* a list item:\n\n  ```yml\n  reservedResources:\n    cpu: 1\n  ```\n\n"
        "```YAML\napiVersion: config.nri/v1alpha1\nkind: BalloonsPolicy\nspec:\n  reservedResources:\n"
        "    cpu: 1\n```\n\n```yaml\nlisten: /run/x.sock\n```\n"
    )
    assert examples([("x.md", text)]) == [
        ("x.md#0", "reservedResources:\n  cpu: 1\n"),
        ("x.md#1", "apiVersion: config.nri/v1alpha1\nkind: BalloonsPolicy\nspec:\n  reservedResources:\n    cpu: 1\n"),
    ]


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
    # Its stateDir, /var/lib/...: this test's own (the file is shared by no two tests).
    assert re.search(r"^stateDir: /\S+", text, re.M), "the example shows no stateDir"
    path.write_text(re.sub(r"^stateDir: \S+", f"stateDir: {tmp_path / 'state'}", text, flags=re.M))
    # As `hook run balloons --config` reads and builds it (hooks/cli.py): HookConfigInvalid if it does not fit.
    hook = BalloonsHook.from_config(str(tmp_path / "balloons.sock"), _load_config(path), sysfs_root=root)
    assert len(hook.state.pool.available) == len(MACHINES[machine].all_cpus)
    assert [b.name for b in hook.state.pool.balloons] == ["reserved[0]", "latency[0]"]
    assert all(b.cpus for b in hook.state.pool.balloons)
    assert await hook.reload(path)  # as the file watch reloads it: False, logged, if it did not fit
    assert hook.state.config.state_dir == str(tmp_path / "state")
