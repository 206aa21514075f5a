"""readiness.py's systemd status line, without a proxy: stand-ins for what it reads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.backend import BackendInfo
from runtimeproxy.cripath.imagewatch import ImageWatch, Probed
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.readiness import describe


def proxy(images: Any) -> Any:
    info = BackendInfo(frozenset({ApiVersion.V1}), "containerd", "1.7.0")
    backend = SimpleNamespace(info=info, connected=True, runtime_socket=Path("/run/c.sock"))
    plan = SimpleNamespace(routes={ApiVersion.V1: ApiVersion.V1})
    return SimpleNamespace(backend=backend, router=SimpleNamespace(plan=plan), images=images)


def test_the_status_line_says_when_a_separate_image_backend_is_not_serving() -> None:
    """Before: 'serving CRI v1' while every image call failed; then 'is
    unreachable', also said of one connected that failed its probe."""
    away = SimpleNamespace(up=False, socket=Path("/run/img.sock"), lost_reason=None)
    assert describe(proxy(away), 1) == (
        "serving CRI v1 (native) for containerd 1.7.0, but the image backend at /run/img.sock is not serving; "
        "1 hook server")
    assert describe(proxy(SimpleNamespace(up=True, socket=Path("/run/img.sock"), lacking=frozenset())), 1) == (
        "serving CRI v1 (native) for containerd 1.7.0; 1 hook server")
    assert describe(proxy(None), 2) == "serving CRI v1 (native) for containerd 1.7.0; 2 hook servers"


def test_the_status_line_says_why_the_image_backend_is_not_serving() -> None:
    """Before: no reason on the line (only in the log and `status`). A long
    reason (a probe's message) is cut to one short line."""
    away = SimpleNamespace(up=False, socket=Path("/run/img.sock"), lost_reason="connection failed")
    assert describe(proxy(away), 1) == (
        "serving CRI v1 (native) for containerd 1.7.0, but the image backend at /run/img.sock is not serving "
        "(connection failed); 1 hook server")
    away.lost_reason = "ImageFsInfo (v1, v1alpha2): UNAVAILABLE: " + "x" * 200 + "\nmore"
    line = describe(proxy(away), 1)
    why = line.split("is not serving (", 1)[1].rsplit("); 1 hook server", 1)[0]
    assert why.startswith("ImageFsInfo (v1, v1alpha2): UNAVAILABLE: xxx") and why.endswith("...")
    assert len(why) == 80 and "\n" not in line


def test_the_status_line_says_which_version_the_image_backend_lacks() -> None:
    """Up, but without a CRI version image calls are sent in (they fail
    UNIMPLEMENTED there). Before: 'serving CRI v1 (native) for ...' alone."""
    lacking = SimpleNamespace(up=True, socket=Path("/run/img.sock"), lacking=frozenset({ApiVersion.V1}))
    assert describe(proxy(lacking), 1) == (
        "serving CRI v1 (native) for containerd 1.7.0, but the image backend at /run/img.sock lacks CRI v1; "
        "1 hook server")


async def test_the_status_line_keeps_the_reason_the_image_backend_was_lost_for(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason at the loss, as the docs say, not the latest failed
    probe's (the line is not sent again for it). Before: the latest."""
    reasons = ["ImageFsInfo (v1, v1alpha2): UNAVAILABLE: first", "ImageFsInfo (v1, v1alpha2): UNAVAILABLE: later"]

    async def probe(channel: Any, timeout: float) -> Probed:
        return Probed(reasons.pop(0))

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    watch = ImageWatch(Path("/run/img.sock"), None)  # type: ignore[arg-type]  # the probe is the stand-in
    for _ in range(2):
        await watch._seen(grpc.ChannelConnectivity.READY)
    assert (watch.up, watch.reason) == (False, "ImageFsInfo (v1, v1alpha2): UNAVAILABLE: later")
    assert describe(proxy(watch), 1).endswith(
        "is not serving (ImageFsInfo (v1, v1alpha2): UNAVAILABLE: first); 1 hook server")
