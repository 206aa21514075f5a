"""fail_or_skip: a missing prerequisite skips, except under CI where it fails."""

from __future__ import annotations

import pytest

from ..prerequisites import fail_or_skip


@pytest.mark.parametrize("value", ["true", "1"])
def test_missing_prerequisite_fails_under_ci(value: str) -> None:
    with pytest.raises(pytest.fail.Exception, match="no tool .*CI is set, so this is an error"):
        fail_or_skip("no tool", {"CI": value})


@pytest.mark.parametrize("environ", [{}, {"CI": ""}])
def test_missing_prerequisite_skips_outside_ci(environ: dict[str, str]) -> None:
    with pytest.raises(pytest.skip.Exception, match="^no tool$"):
        fail_or_skip("no tool", environ)


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        fail_or_skip("no tool")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        fail_or_skip("no tool")
