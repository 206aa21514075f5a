"""The status document and its text (`runtime-proxy status`), without a proxy: stand-ins for what it reads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from runtimeproxy.admin import MAX_REASON, MAX_REJECTED, StatusSource, render
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.hookpath.registry import HookSnapshot, ReloadResult


def source(last: ReloadResult, directory: Path = Path("/etc/runtime/hookserver.d")) -> StatusSource:
    backend = SimpleNamespace(info=None, runtime_socket=Path("/run/c.sock"), image_socket=Path("/run/c.sock"),
                              connected=False)
    proxy: Any = SimpleNamespace(backend=backend, router=SimpleNamespace(plan=None), images=None,
                                 config=SimpleNamespace(listen=Path("/run/p.sock")))
    registry: Any = SimpleNamespace(snapshot=HookSnapshot(), directory=directory, last_reload=last)
    metrics: Any = SimpleNamespace(cri=SimpleNamespace(served=0, active=0), hook_stats={})
    return StatusSource(proxy, registry, metrics, time.time(), time.monotonic())


def test_a_huge_rejection_reason_is_cut_in_the_document() -> None:
    """Reasons were sent whole: a few 900 kB ones passed grpc's 4 MiB limit and `status` got nothing."""
    doc = source(ReloadResult(rejected={"huge.json": "x" * 900_000, "small.json": "file is empty"})).document()
    rejected = doc["hook_files_rejected"]
    assert rejected["small.json"] == "file is empty"
    assert len(rejected["huge.json"]) < MAX_REASON + 100
    assert rejected["huge.json"].endswith("... (900000 characters, cut; the proxy's log has it whole)")


def test_the_rejected_hook_files_listed_are_capped_with_a_count_of_the_rest() -> None:
    """Every rejected file was listed: 5000 of them with 1000-character reasons passed grpc's 4 MiB limit."""
    many = {f"f{i:05}.json": "y" * 5000 for i in range(5000)}
    doc = source(ReloadResult(rejected=many)).document()
    assert list(doc["hook_files_rejected"]) == sorted(many)[:MAX_REJECTED]
    assert doc["hook_files_rejected_more"] == 5000 - MAX_REJECTED
    assert len(json.dumps(doc)) < 200_000
    text = render(doc)
    assert "hook files rejected: 5000 " in text and text.endswith(f"\n  ... and {5000 - MAX_REJECTED} more")
    few = source(ReloadResult(rejected={"a.json": "file is empty"})).document()
    assert few["hook_files_rejected_more"] == 0 and "more" not in render(few)


def document(**hooks: Any) -> dict[str, Any]:
    """A status document as a proxy sends it, with the hook keys given (none: a proxy older than them)."""
    doc = source(ReloadResult()).document()
    for key in ("hook_dir", "hook_dir_problem", "hook_dir_unsafe", "hook_dir_kept", "hook_files_rejected",
                "hook_files_rejected_more"):
        doc.pop(key, None)
    return {**doc, **hooks}


def test_a_hook_file_name_with_a_newline_prints_no_line_of_its_own() -> None:
    """A file named "a.json\\nhook servers: 9" printed a fake line in `status`."""
    name = "a.json\nhook servers: 9, from /etc/elsewhere"
    text = render(document(hook_dir="/h", hook_files_rejected={name: "invalid JSON: x\ny"}))
    assert "\nhook servers: 9" not in text
    assert f"  {name!r}: 'invalid JSON: x\\ny'" in text
    assert len(text.splitlines()) == 7


def test_a_proxy_older_than_the_hook_dir_key_gets_no_from() -> None:
    """It printed `hook servers: 0, from ?`."""
    assert "hook servers: 0\n" in render(document()) + "\n"
    assert "hook servers: 0, from /h\n" in render(document(hook_dir="/h")) + "\n"


def test_an_unsafe_hook_directory_says_the_hooks_loaded_before_stay() -> None:
    """It said `refusing to load any hook` while the hooks loaded before were still called."""
    problem = "refusing to load any hook: hook directory /h is writable by others (mode 0777)"
    doc = source(ReloadResult(directory_error=problem, directory_unsafe=True, directory_kept=True), Path("/h")).document()
    assert doc["hook_dir_unsafe"] is True
    assert f"  hook directory: {problem} (no hook was loaded before it)" in render(doc)
    missing = source(ReloadResult(directory_error="hook directory /h does not exist"), Path("/h")).document()
    assert missing["hook_dir_unsafe"] is False and missing["hook_dir_kept"] is False
    assert render(missing).endswith("  hook directory: hook directory /h does not exist")


SERVER = {"name": "a.json", "endpoint": "/run/a.sock", "hooks": ["PreCreateContainer"], "failure_policy": "Fail",
          "timeout_s": 1.0, "priority": 0, "calls": {}, "last_error": None}


def test_a_directory_not_read_says_which_hooks_stay_in_force() -> None:
    """An unreadable directory showed its problem and not that the hooks stay (a file in its place means no hooks)."""
    problem = "cannot stat hook directory /h: Permission denied"
    doc = source(ReloadResult(directory_error=problem, directory_kept=True), Path("/h")).document()
    assert (doc["hook_dir_kept"], doc["hook_dir_unsafe"]) == (True, False)
    text = render({**doc, "hook_servers": [SERVER, {**SERVER, "name": "b.json"}]})
    assert f"  hook directory: {problem} (the hooks loaded before stay in force: a.json, b.json)" in text.splitlines()
    # A proxy older than hook_dir_kept said so for an unsafe directory only.
    older = {k: v for k, v in doc.items() if k != "hook_dir_kept"}
    assert render({**older, "hook_dir_unsafe": True}).endswith("(no hook was loaded before it)")
    assert render(older).endswith(f"  hook directory: {problem}")


def test_a_hook_servers_last_error_shows_its_cause() -> None:
    """It showed the outcome, hook point and time, and not why."""
    server = {"name": "a.json", "endpoint": "/run/a.sock", "hooks": ["PreCreateContainer"], "failure_policy": "Fail",
              "timeout_s": 1.0, "priority": 0, "calls": {"unavailable": 1}}
    at = 1_700_000_000.0
    error = {"outcome": "unavailable", "hook": "PreCreateContainer", "at": at,
             "cause": "UNAVAILABLE: cannot connect to /run/a.sock: Connection refused\n(twice)"}
    text = render(document(hook_servers=[{**server, "last_error": error}]))
    assert ("    last error: unavailable on PreCreateContainer at 2023-11-14T22:13:20Z: "
            "'UNAVAILABLE: cannot connect to /run/a.sock: Connection refused\\n(twice)'") in text.splitlines()
    older = {k: v for k, v in error.items() if k != "cause"}  # a proxy older than the cause
    assert "    last error: unavailable on PreCreateContainer at 2023-11-14T22:13:20Z" in render(
        document(hook_servers=[{**server, "last_error": older}])).splitlines()


def test_a_separate_image_backend_failing_its_probe_shows_why() -> None:
    """Connected and failing its probe: the document carries the reason, the
    text shows it (before: only NOT CONNECTED, which it was not)."""
    src = source(ReloadResult())
    reason = "ImageFsInfo (v1, v1alpha2): UNAVAILABLE: image store not ready"
    src.proxy.images = SimpleNamespace(up=False, reason=reason, versions=None, unknown=frozenset(), lacking=frozenset())
    src.proxy.backend.image_socket = Path("/run/img.sock")
    doc = src.document()
    assert (doc["backend"]["image_connected"], doc["backend"]["image_problem"]) == (False, reason)
    assert f"; images at /run/img.sock, NOT SERVING ({reason})\n" in render(doc)
    src.proxy.images = SimpleNamespace(up=True, reason=None, versions=None, unknown=frozenset(), lacking=frozenset())
    assert src.document()["backend"]["image_problem"] is None


def test_a_separate_image_backend_not_serving_is_shown() -> None:
    """A separate image service's state: NOT SERVING while image calls fail
    (before: status said nothing of it; then NOT CONNECTED, also of one
    connected that failed its probe); no word of it when the runtime
    serves images (null), or from a proxy older than the key."""
    doc = document()
    assert doc["backend"]["image_connected"] is None and "images at" not in render(doc)
    assert doc["backend"]["image_problem"] is None
    apart = {**doc, "backend": {**doc["backend"], "image_socket": "/run/img.sock", "image_connected": False}}
    assert "; images at /run/img.sock, NOT SERVING\n" in render(apart)
    serving = {**doc, "backend": {**apart["backend"], "image_connected": True}}
    assert "; images at /run/img.sock, serving\n" in render(serving)
    older = {**doc, "backend": {k: v for k, v in doc["backend"].items() if k != "image_connected"}}
    assert "images at" not in render(older)


def test_a_separate_image_backend_lacking_a_version_image_calls_are_sent_in_is_shown() -> None:
    """Serving, but without a CRI version image calls are sent in: status
    names its versions and the one it lacks (before: "serving" alone,
    while those image calls failed UNIMPLEMENTED)."""
    src = source(ReloadResult())
    src.proxy.images = SimpleNamespace(up=True, reason=None, versions=frozenset({ApiVersion.V1ALPHA2}),
                                       unknown=frozenset(), lacking=frozenset({ApiVersion.V1}),
                                       targets=frozenset({ApiVersion.V1}))
    src.proxy.backend.image_socket = Path("/run/img.sock")
    doc = src.document()
    assert (doc["backend"]["image_versions"], doc["backend"]["image_lacking"]) == (["v1alpha2"], ["v1"])
    assert ("; images at /run/img.sock, serving CRI v1alpha2, LACKING CRI v1 (its image calls fail)\n"
            in render(doc))
    src.proxy.images = SimpleNamespace(up=True, reason=None, versions=frozenset(ApiVersion),
                                       unknown=frozenset({ApiVersion.V1ALPHA2}), lacking=frozenset(),
                                       targets=frozenset({ApiVersion.V1}))
    assert "; images at /run/img.sock, serving CRI v1, v1alpha2 (unknown)\n" in render(src.document())
    assert src.document()["backend"]["image_lacking"] == []


def test_image_lacking_is_null_while_not_known() -> None:
    """Down (no versions probed) or before the proxy's plan: image_lacking
    is null, as its comment says, not [] (before: [] read as "lacks none")."""
    src = source(ReloadResult())
    src.proxy.backend.image_socket = Path("/run/img.sock")
    src.proxy.images = SimpleNamespace(up=False, reason="connection failed", versions=None,
                                       unknown=frozenset(), lacking=frozenset(), targets=frozenset({ApiVersion.V1}))
    assert src.document()["backend"]["image_lacking"] is None
    src.proxy.images = SimpleNamespace(up=True, reason=None, versions=frozenset({ApiVersion.V1}),
                                       unknown=frozenset(), lacking=frozenset(), targets=None)
    assert src.document()["backend"]["image_lacking"] is None
