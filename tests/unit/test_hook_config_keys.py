"""``hook run --config``: a key given twice, as in the proxy's config (yamlkeys.py),
nested mappings too: the same value twice is a warning, different values an error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hooks.cli import SetupError, _load_config


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
