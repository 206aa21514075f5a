"""check-config names every problem in one run: each refused setting of the
config file, what its other settings name (sockets, the hook directory), and
each problem of each hook file, one line each; serve stops at its first."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimeproxy.checkconfig import Finding, Severity, check
from runtimeproxy.config import ConfigError, load
from runtimeproxy.hookpath.hookfile import HookConfigError, parse_hook_file
from runtimeproxy.hookpath.registry import HookRegistry

from .test_checkconfig import good_config, hook_dir, hook_file, live, only, valid_hook  # noqa: F401 (fixtures)


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_every_refused_setting_is_an_error_of_its_own_line(tmp_path: Path, live: Path, hook_dir: Path) -> None:  # noqa: F811
    """Only the first (line 2) was named: fixed, the next run named line 4, then line 5."""
    path = config_file(tmp_path, (
        f"listen: {tmp_path / 'p.sock'}\nlog-level: loud\nbackend: {live}\ngrace-perod: 5\n"
        f"serve-versions: v3\nhook-dir: {hook_dir}\n"
    ))
    report = check(path)
    errors = only(report.findings, Severity.ERROR)
    assert [(f.subject, f.line) for f in errors] == [(path, 2), (path, 4), (path, 5)]
    assert "log-level 'loud': expected one of" in errors[0].reason
    assert "unknown setting 'grace-perod' (did you mean 'grace-period'?) (line 4)" in errors[1].reason
    assert "serve-versions 'v3'" in errors[2].reason
    with pytest.raises(ConfigError) as refused:
        load(path)  # serve: every one, in the same words
    prefix = f"config file {path}: "
    assert str(refused.value).splitlines() == [f"{prefix}3 errors:", *(f"  {f.reason.removeprefix(prefix)}" for f in errors)]
    assert not report.ok and report.config is None
    assert report.hook_dir == hook_dir  # its hook-dir was fine: checked as well
    assert list(report.lines())[-1] == "3 error(s), 0 warning(s)"


def test_what_the_other_settings_name_is_checked_beside_a_refused_one(tmp_path: Path, hook_dir: Path) -> None:  # noqa: F811
    """A refused setting stopped the check: the backend that is no socket and the bad hook file came next run."""
    regular = tmp_path / "containerd.sock"
    regular.write_text("")
    bad_hook = hook_file(hook_dir, "bad.json", "{")
    path = config_file(tmp_path, f"log-level: loud\nbackend: {regular}\nhook-dir: {hook_dir}\n")
    errors = only(check(path).findings, Severity.ERROR)
    assert [(f.subject, f.line) for f in errors] == [(path, 1), (regular, None), (bad_hook, None)]
    assert errors[1].reason == "backend: exists and is not a unix socket"
    assert errors[2].reason.startswith("invalid JSON")


def test_a_refused_setting_is_not_checked_as_its_default(tmp_path: Path) -> None:
    """A refused backend or hook-dir is no one's: its default is neither probed nor read."""
    path = config_file(tmp_path, "backend: tcp://10.0.0.1:1\nhook-dir: ''\n")
    report = check(path)
    assert [f.line for f in report.findings] == [1, 2]  # nothing of /run/containerd/containerd.sock
    assert report.hook_dir is None
    assert "hook directory: not checked (the config naming it was refused; give --hook-dir)" in list(report.lines())


def test_a_setting_given_twice_and_another_refused_are_both_named(tmp_path: Path, live: Path) -> None:  # noqa: F811
    path = config_file(tmp_path, f"backend: {live}\nlog-level: info\nlog-level: debug\ndata-path: fast\n")
    errors = only(check(path, tmp_path).findings, Severity.ERROR)
    assert [f.line for f in errors] == [3, 4]
    assert "to different values" in errors[0].reason and "data-path 'fast'" in errors[1].reason


BROKEN = {"remote-endpoint": "relative.sock", "failure-policy": "Retry", "runtime-hooks": ["PreA", "PreB"],
          "timeout": "forever", "priority": "high", "answers": "all"}


def test_every_problem_of_a_hook_file_is_a_line_naming_its_key(tmp_path: Path, live: Path, hook_dir: Path) -> None:  # noqa: F811
    """Only the first ("relative.sock") was named: five more runs to find the rest."""
    path = hook_file(hook_dir, "broken.json", BROKEN)
    errors = only(check(good_config(tmp_path, live, hook_dir)).findings, Severity.ERROR)
    assert [f.subject for f in errors] == [path] * 6
    assert [f.reason.split(" ")[0:2] for f in errors] == [
        ['"remote-endpoint"', "must"], ["unknown", '"failure-policy"'], ["unknown", "runtime"],
        ["bad", '"timeout":'], ['"priority"', "must"], ["unknown", '"answers"'],
    ]
    assert errors[2].reason.startswith("unknown runtime hooks 'PreA', 'PreB' (allowed: ")


def test_serve_logs_every_problem_of_a_hook_file_in_its_one_reason(hook_dir: Path) -> None:  # noqa: F811
    path = hook_file(hook_dir, "broken.json", {"remote-endpoint": "/run/a.sock", "timeout": "0s", "priority": 1.5})
    with pytest.raises(HookConfigError) as err:
        parse_hook_file(path)
    assert err.value.problems == ('bad "timeout": \'0s\' must be greater than zero', '"priority" must be an integer, got number 1.5')
    assert err.value.reason == "; ".join(err.value.problems)
    assert HookRegistry(hook_dir).reload().rejected == {"broken.json": err.value.reason}


def test_a_runtime_hooks_entry_not_a_string_and_the_unknown_names_are_each_a_problem(hook_dir: Path) -> None:  # noqa: F811
    """["PreA", 5] named only the 5 ("entries must be strings"): main named 'PreA' as well."""
    path = hook_file(hook_dir, "mixed.json", {"remote-endpoint": "/run/a.sock", "runtime-hooks": ["PreA", 5, True, "PreB"]})
    with pytest.raises(HookConfigError) as err:
        parse_hook_file(path)
    assert err.value.problems[0] == '"runtime-hooks" entries must be strings, got number'
    assert err.value.problems[1].startswith("unknown runtime hooks 'PreA', 'PreB' (allowed: ")
    assert len(err.value.problems) == 2


def test_a_hook_file_refused_as_unsafe_has_its_content_judged_too(tmp_path: Path, live: Path, hook_dir: Path) -> None:  # noqa: F811
    """Made safe with chmod, it was refused again for a bad timeout."""
    path = hook_file(hook_dir, "loose.json", valid_hook(live, timeout="2 seconds", timout="1s"), mode=0o666)
    findings = [f for f in check(good_config(tmp_path, live, hook_dir)).findings if f.subject == path]
    assert [(f.severity, f.reason.split(":")[0]) for f in findings] == [
        (Severity.ERROR, "refused"), (Severity.ERROR, 'bad "timeout"'), (Severity.WARNING, "keys ignored (not read by the proxy)"),
    ]
    assert findings[0].reason.startswith("refused: file") and "writable by group and others" in findings[0].reason


@pytest.mark.parametrize("where", ["a directory others can write", "a file others can write"])
def test_a_symlink_refused_for_where_it_points_has_no_content_judged(
    tmp_path: Path, live: Path, hook_dir: Path, where: str  # noqa: F811
) -> None:
    """Its target was read as if it were safe: root's check-config showed what a file
    anyone could point it at holds (its values, its keys)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o777 if where.startswith("a directory") else 0o755)
    target = hook_file(elsewhere, "secret.json", {"remote-endpoint": "secret-value", "secret-key": 1},
                       mode=0o644 if where.startswith("a directory") else 0o666)
    path = hook_dir / "link.json"
    path.symlink_to(target)
    findings = [f for f in check(good_config(tmp_path, live, hook_dir)).findings if f.subject == path]
    assert [f.severity for f in findings] == [Severity.ERROR]
    assert findings[0].reason.startswith("refused: symlink target")
    assert "secret" not in findings[0].reason.replace(str(target), "").replace(str(elsewhere), "")
    with pytest.raises(HookConfigError):  # the second read never follows one (made a symlink meanwhile, say)
        parse_hook_file(path, check_permissions=False, follow_symlinks=False)


def test_a_findings_line_names_the_file_and_the_key(tmp_path: Path, live: Path, hook_dir: Path) -> None:  # noqa: F811
    path = hook_file(hook_dir, "t.json", valid_hook(live, timeout="soon", priority="high"))
    lines = list(check(good_config(tmp_path, live, hook_dir)).lines())
    assert f"error: {path}: bad \"timeout\": invalid duration 'soon'" in "\n".join(lines)
    assert f"error: {path}: \"priority\" must be an integer, got string 'high'" in lines
    assert Finding(Severity.ERROR, path, "x").__str__() == f"error: {path}: x"
