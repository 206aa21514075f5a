"""check-config on a hook file whose keys koord-runtime-proxy reads in any case (hookkeys.py)."""

from __future__ import annotations

from pathlib import Path

from runtimeproxy.checkconfig import Finding, Severity, check

from .test_checkconfig import good_config, hook_dir, hook_file, live, valid_hook  # noqa: F401 (fixtures)


def test_a_key_in_another_case_is_a_warning_naming_both_not_an_ignored_key(
    tmp_path: Path, live: Path, hook_dir: Path  # noqa: F811
) -> None:
    """`"Remote-Endpoint"` made the file invalid (`missing "remote-endpoint"`) and the key `ignored`."""
    path = hook_file(hook_dir, "koord.json", {"Remote-Endpoint": str(live), "Runtime-Hooks": ["PreCreateContainer"]})
    report = check(good_config(tmp_path, live, hook_dir))
    assert list(report.findings) == [
        Finding(Severity.WARNING, path, 'key "Remote-Endpoint" read as "remote-endpoint" (koord-runtime-proxy reads keys in any case)'),
        Finding(Severity.WARNING, path, 'key "Runtime-Hooks" read as "runtime-hooks" (koord-runtime-proxy reads keys in any case)'),
    ]
    assert report.ok and [s.endpoint for s in report.servers] == [str(live)]


def test_a_key_of_ours_in_another_case_is_ignored_naming_the_key_it_may_mean(
    tmp_path: Path, live: Path, hook_dir: Path  # noqa: F811
) -> None:
    """Our keys are no field of koord-runtime-proxy's struct: `"Timeout": "bad"` refused a file that loads on main."""
    path = hook_file(hook_dir, "ours.json", {"remote-endpoint": str(live), "runtime-hooks": ["PreCreateContainer"],
                                             "Timeout": "bad", "extra": 1})
    report = check(good_config(tmp_path, live, hook_dir))
    assert list(report.findings) == [
        Finding(Severity.WARNING, path, "key \"Timeout\" ignored: did you mean 'timeout'? (keys of ours are read as "
                                        "written; only Koordinator's are read in any case)"),
        Finding(Severity.WARNING, path, "keys ignored (not read by the proxy): 'extra'"),
    ]
    assert report.ok and [s.timeout for s in report.servers] == [2.0]


def test_keys_nothing_reads_are_shown_quoted_whatever_they_hold(
    tmp_path: Path, live: Path, hook_dir: Path  # noqa: F811
) -> None:
    """A key "\\ud800" made check-config die of a UnicodeEncodeError as it printed the line,
    and a key holding a newline printed a report line of the file's choosing."""
    forged = "x\nerror: /etc/runtime/hookserver.d/koordlet.json: forged"
    path = hook_file(hook_dir, "odd.json", {**valid_hook(live), "\ud800": 1, forged: 2})
    report = check(good_config(tmp_path, live, hook_dir))
    assert list(report.findings) == [Finding(
        Severity.WARNING, path, "keys ignored (not read by the proxy): "
        "'x\\nerror: /etc/runtime/hookserver.d/koordlet.json: forged', '\\ud800'",
    )]
    text = "\n".join(report.lines())
    text.encode()  # printable: no lone surrogate
    assert not [line for line in text.splitlines() if line.startswith("error:")]
