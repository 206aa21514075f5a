"""logs.py: one structured line per event, with the ``extra`` fields."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy import logs
from runtimeproxy.logs import JsonFormatter, TextFormatter


def record(msg: str = "hook failed", level: int = logging.WARNING, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom\nsecond line")
        except RuntimeError:
            exc_info = sys.exc_info()
    rec = logging.getLogger("runtimeproxy.test").makeRecord(
        "runtimeproxy.test", level, __file__, 1, msg, None, exc_info, extra=extra
    )
    return rec


# --------------------------------------------------------------------------- text


def test_text_has_level_logger_message_and_extra_fields() -> None:
    line = TextFormatter().format(record(hook="quota", attempt=2, error="timed out"))
    assert "\n" not in line
    assert " warning runtimeproxy.test 'hook failed' " in line
    assert line.endswith("hook=quota attempt=2 error=\"timed out\"")


def test_text_timestamp_is_utc_iso() -> None:
    line = TextFormatter().format(record())
    stamp = line.split(" ", 1)[0]
    assert stamp.endswith("+00:00")
    assert "T" in stamp


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ("", '""'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a=b", '"a=b"'),
        ("tab\there", '"tab\\there"'),
        ("line\nbreak", '"line\\nbreak"'),
        (3.5, "3.5"),
        (Path("/run/x.sock"), "/run/x.sock"),
        (["PreRunPodSandbox", "PostStopPodSandbox"], "PreRunPodSandbox,PostStopPodSandbox"),
        (("a b", "c"), '"a b,c"'),
        ([], '""'),
        ({"b", "c", "a"}, "a,b,c"),  # sorted, not in hash order
        (frozenset({3, 10, 2}), "2,3,10"),
    ],
)
def test_text_field_values_are_quoted_when_needed(value: object, shown: str) -> None:
    line = TextFormatter().format(record(field=value))
    assert line.endswith(f" field={shown}")
    assert "\n" not in line


def test_text_leaves_out_a_field_with_no_value() -> None:
    line = TextFormatter().format(record("starting", config_file=None, timeout=None, priority=5))
    assert line.endswith("'starting' priority=5")


def test_json_keeps_a_field_with_no_value_as_null() -> None:
    doc = json.loads(JsonFormatter().format(record("starting", config_file=None)))
    assert doc["config_file"] is None


def test_text_without_extra_has_no_fields() -> None:
    line = TextFormatter().format(record("listening"))
    assert line.endswith("'listening'")


def test_text_message_arguments_are_applied() -> None:
    rec = logging.getLogger("x").makeRecord("x", logging.INFO, __file__, 1, "got %d calls", (3,), None)
    assert TextFormatter().format(rec).endswith("'got 3 calls'")


def test_text_appends_the_exception() -> None:
    out = TextFormatter().format(record(exc=True, hook="h"))
    first, rest = out.split("\n", 1)
    assert first.endswith("hook=h")
    assert "Traceback" in rest and "RuntimeError: boom" in rest


# --------------------------------------------------------------------------- json


def test_json_is_one_valid_line_with_extra_fields() -> None:
    line = JsonFormatter().format(record(hook="quota", attempt=2, error="timed\nout"))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "warning"
    assert doc["logger"] == "runtimeproxy.test"
    assert doc["msg"] == "hook failed"
    assert doc["hook"] == "quota"
    assert doc["attempt"] == 2
    assert doc["error"] == "timed\nout"
    assert doc["time"].endswith("+00:00")
    # Nothing of the LogRecord's own attributes leaks in.
    assert set(doc) == {"time", "level", "logger", "msg", "hook", "attempt", "error"}


def test_json_non_serializable_values_become_strings() -> None:
    doc = json.loads(JsonFormatter().format(record(path=Path("/run/x.sock"), versions=frozenset({"v1"}))))
    assert doc["path"] == "/run/x.sock"
    assert doc["versions"] == ["v1"]


def test_json_writes_a_set_as_a_sorted_list_not_in_hash_order() -> None:
    doc = json.loads(JsonFormatter().format(record(
        hooks={"b", "a", "c"}, points=frozenset({3, 10, 2}), mixed={1, "a"}, nested=[Path("/x")],
    )))
    assert (doc["hooks"], doc["points"], doc["mixed"], doc["nested"]) == (["a", "b", "c"], [2, 3, 10], [1, "a"], ["/x"])


def test_json_exception_stays_on_one_line() -> None:
    line = JsonFormatter().format(record(exc=True, hook="h"))
    assert "\n" not in line
    doc = json.loads(line)
    assert "RuntimeError: boom" in doc["exception"]
    assert doc["hook"] == "h"


def test_json_multiline_message_stays_on_one_line() -> None:
    line = JsonFormatter().format(record("first\nsecond"))
    assert "\n" not in line
    assert json.loads(line)["msg"] == "first\nsecond"


# --------------------------------------------------------------------------- setup


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    grpc_level = logging.getLogger("grpc").level
    watchfiles_level = logging.getLogger("watchfiles").level
    hpack_level = logging.getLogger("hpack").level
    core_filters = logging.getLogger("grpc._cython.cygrpc").filters[:]
    try:
        yield
    finally:
        logging.getLogger("grpc._cython.cygrpc").filters[:] = core_filters
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("grpc").setLevel(grpc_level)
        logging.getLogger("watchfiles").setLevel(watchfiles_level)
        logging.getLogger("hpack").setLevel(hpack_level)


def test_setup_json_writes_one_json_line_per_record(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup("json", "debug")
    log = logging.getLogger("runtimeproxy.test.setup")
    log.debug("first", extra={"n": 1})
    log.warning("second", extra={"socket": "/run/p.sock"})
    lines = capsys.readouterr().err.splitlines()
    docs = [json.loads(line) for line in lines]
    assert [(d["msg"], d["level"]) for d in docs] == [("first", "debug"), ("second", "warning")]
    assert docs[0]["n"] == 1
    assert docs[1]["socket"] == "/run/p.sock"
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("grpc").level == logging.INFO  # grpc's debug noise stays off


def test_setup_text_and_level(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup("text", "warning")
    log = logging.getLogger("runtimeproxy.test.setup")
    log.info("hidden")
    log.warning("shown", extra={"k": "v"})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("'shown' k=v")
    assert len(logging.getLogger().handlers) == 1
    assert isinstance(logging.getLogger().handlers[0].formatter, TextFormatter)
    assert logging.getLogger("grpc").level == logging.WARNING


def test_debug_shows_our_lines_not_hpacks_per_header_ones(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """At --log-level debug, hpack logged each header it decoded: 117 of a pod's 137 lines."""
    logs.setup("text", "debug")
    logging.getLogger("hpack.hpack").debug("Decoded %d, consumed %d bytes", 13, 1)  # as hpack logs each header
    logging.getLogger("hpack.table").debug("Adding (b':path', b'/x') to the header table")
    logging.getLogger("hpack.hpack").warning("still shown")
    logging.getLogger("runtimeproxy.test.setup").debug("ours")
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit(" ", 1)[-1] for line in lines] == ["shown'", "'ours'"]


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_watchfiles_change_counts_show_at_debug_only(
    restore_logging: None, capsys: pytest.CaptureFixture[str], level: str, shown: bool
) -> None:
    logs.setup("text", level)
    logging.getLogger("watchfiles.main").info("%d changes detected", 3)  # as watchfiles logs each batch
    logging.getLogger("watchfiles.main").warning("still shown")
    lines = capsys.readouterr().err.splitlines()
    assert any("changes detected" in line for line in lines) is shown
    assert any("still shown" in line for line in lines)


class ExecuteBatchError(Exception):
    """Stands for grpc's cygrpc.ExecuteBatchError (matched by name)."""


def _core_batch_failure() -> None:
    try:
        raise ExecuteBatchError('Failed "execute_batch": (SendMessageOperation, SendStatusFromServerOperation)')
    except ExecuteBatchError:
        logging.getLogger("grpc._cython.cygrpc").exception(
            "ExecuteBatchError raised in core by servicer method [/runtime.v1.RuntimeService/Version]"
        )


@pytest.mark.parametrize("level", ["info", "debug"])
def test_an_answer_to_a_gone_client_is_one_debug_line_not_a_traceback(
    restore_logging: None, capsys: pytest.CaptureFixture[str], level: str
) -> None:
    logs.setup("text", level)
    logs.setup("text", level)  # set up twice: still one filter, one line
    _core_batch_failure()
    logging.getLogger("grpc._cython.cygrpc").error("another core error")
    lines = capsys.readouterr().err.splitlines()
    assert "Traceback" not in "\n".join(lines)
    assert len(lines) == (2 if level == "debug" else 1), lines
    assert "another core error" in lines[-1]
    if level == "debug":
        assert lines[0].split(" ", 1)[1].startswith("debug grpc._cython.cygrpc \"answer not sent: the client's connection closed\"")
        assert lines[0].endswith("method=/runtime.v1.RuntimeService/Version")
