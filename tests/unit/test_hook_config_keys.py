"""``hook run --config``: a key given twice, as in the proxy's config (yamlkeys.py),
nested mappings too: the same value twice is a warning, different values an error."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from hooks.cli import SetupError, _load_config

from .test_config_mistakes import billion_laughs


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hook.yaml"
    path.write_text(text)
    return path


def test_a_nested_key_given_twice_with_different_values_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "balloonTypes:\n  - name: a\n    minCPUs: 1\n    minCPUs: 2\n")
    with pytest.raises(SetupError) as err:
        _load_config(path)
    assert err.value.message == (
        f"hook config {path}: 'balloonTypes[0].minCPUs' is set twice (lines 3 and 4), "
        "to different values (YAML keeps the last); keep one"
    )


def test_a_key_given_twice_with_the_same_value_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "reservedResources:\n  cpu: 1\n  cpu: 1\n")
    caplog.set_level(logging.WARNING, logger="hooks")
    assert _load_config(path) == {"reservedResources": {"cpu": 1}}
    (record,) = caplog.records
    assert (record.getMessage(), record.line) == ("hook config warning", 3)
    assert record.warning == "'reservedResources.cpu' is set twice (lines 2 and 3), to the same value; keep one"


def test_merge_keys_are_no_key_given_twice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "base: &b {minCPUs: 1}\ntype:\n  <<: *b\n  <<: {maxCPUs: 4}\n  minCPUs: 2\n")
    caplog.set_level(logging.WARNING, logger="hooks")
    doc = _load_config(path)
    assert doc["type"] == {"minCPUs": 2, "maxCPUs": 4}
    assert caplog.records == []


def test_a_recursive_value_given_twice_is_the_same_value(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "x: &a [*a]\nx: *a\n")
    caplog.set_level(logging.WARNING, logger="hooks")
    doc = _load_config(path)
    assert doc["x"][0] is doc["x"]
    assert [r.warning for r in caplog.records] == ["'x' is set twice (lines 1 and 2), to the same value; keep one"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # one key of the mapping safe_load builds (1 and 1.0, on and 1), not reported before
        ("cpus: {1: a, 1.0: b}\n", "'cpus.1' (line 1) is set again as '1.0' (line 1), to different values"),
        ("cpus: {on: a, 1: a}\n", "'cpus.on' (line 1) is set again as '1' (line 1), to the same value"),
        ("x: [1]\nx: [1.0]\n", "'x' is set twice (lines 1 and 2), to different values"),
        ("x: .nan\nx: .nan\n", "'x' is set twice (lines 1 and 2), to the same value"),
        ("x: {a: 1, b: [2]}\nx: {b: [2], a: 1}\n", "'x' is set twice (lines 1 and 2), to the same value"),
        # a mapping's keys compared as scalars are: an int and a float differ, 0x1 is 1
        ("x: {1: a}\nx: {1.0: a}\n", "'x' is set twice (lines 1 and 2), to different values"),
        ("x: {0x1: a}\nx: {1: a}\n", "'x' is set twice (lines 1 and 2), to the same value"),
        ("x: {<<: {a: 1}, b: 2}\nx: {a: 1, b: 2}\n", "'x' is set twice (lines 1 and 2), to the same value"),
    ],
)
def test_keys_and_values_given_twice_are_compared_as_yaml_reads_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, said: str
) -> None:
    path = write(tmp_path, text)
    caplog.set_level(logging.WARNING, logger="hooks")
    if "different" in said:
        with pytest.raises(SetupError) as err:
            _load_config(path)
        assert err.value.message.startswith(f"hook config {path}: {said}")
    else:
        _load_config(path)
        assert [r.warning for r in caplog.records] == [f"{said}; keep one"]


def test_a_billion_laughs_given_twice_is_compared_without_being_built(tmp_path: Path) -> None:
    path = write(tmp_path, billion_laughs(12, "x"))  # a hook config in a ConfigMap as well as a file
    script = "import sys; from pathlib import Path; from hooks.cli import _load_config; _load_config(Path(sys.argv[1])); print('read')"
    # A hang guard, not a speed target: built out, the comparison took 9 s at 10 levels, 12 minutes at 12.
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert done.stdout == "read\n", done.stderr
