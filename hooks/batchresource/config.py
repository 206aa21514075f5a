"""The hook's YAML config (every key optional; see docs/hook-batchresource.md for the reference)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimeproxy.hookpath.duration import parse_duration
from runtimeproxy.shown import shown

from ..builtin import HookConfigInvalid
from ..criclient import DEFAULT_RUNTIME_ENDPOINT, endpoint_socket
from .cgroups import CgroupDriver

__all__ = ["BatchResourceConfig"]

_KEYS = (
    "cgroup_root", "cgroup_driver", "cgroup_version", "state_dir", "reconcile_interval", "cfs_quota_enabled", "runtime_endpoint",
)


@dataclass(frozen=True)
class BatchResourceConfig:
    cgroup_root: Path = Path("/sys/fs/cgroup")
    cgroup_driver: CgroupDriver = CgroupDriver.AUTO
    cgroup_version: int | None = None  # None: detected from cgroup_root
    state_dir: Path = Path("/var/lib/runtime-proxy/batchresource")
    reconcile_interval: float = 10.0
    cfs_quota_enabled: bool = True
    # Listed each reconcile_interval for BE pods no hook call told of; "" lists nothing.
    runtime_endpoint: str = DEFAULT_RUNTIME_ENDPOINT

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> BatchResourceConfig:
        unknown = sorted(set(raw) - set(_KEYS))
        if unknown:
            raise HookConfigInvalid(f"batchresource: unknown config keys {unknown} (known: {', '.join(_KEYS)})")
        values: dict[str, Any] = {}
        for key in ("cgroup_root", "state_dir"):
            if key in raw:
                if not isinstance(raw[key], str) or not raw[key].startswith("/"):
                    raise HookConfigInvalid(f"batchresource: {key} must be an absolute path, got {shown(raw[key])}")
                values[key] = Path(raw[key])
        if "cgroup_driver" in raw:
            try:  # a string alone: Enum's own ValueError would repr the value in full (a billion laughs)
                values["cgroup_driver"] = CgroupDriver(raw["cgroup_driver"] if isinstance(raw["cgroup_driver"], str) else None)
            except ValueError:
                raise HookConfigInvalid(
                    f"batchresource: cgroup_driver must be auto, cgroupfs or systemd, got {shown(raw['cgroup_driver'])}"
                ) from None
        if "cgroup_version" in raw:
            version = raw["cgroup_version"]
            if version not in ("auto", 1, 2):
                raise HookConfigInvalid(f"batchresource: cgroup_version must be auto, 1 or 2, got {shown(version)}")
            values["cgroup_version"] = None if version == "auto" else version
        if "reconcile_interval" in raw:
            values["reconcile_interval"] = _interval(raw["reconcile_interval"])
        if "cfs_quota_enabled" in raw:
            if not isinstance(raw["cfs_quota_enabled"], bool):
                raise HookConfigInvalid(f"batchresource: cfs_quota_enabled must be true or false, got {shown(raw['cfs_quota_enabled'])}")
            values["cfs_quota_enabled"] = raw["cfs_quota_enabled"]
        if "runtime_endpoint" in raw:
            values["runtime_endpoint"] = _endpoint(raw["runtime_endpoint"])
        return cls(**values)


def _endpoint(value: object) -> str:
    """A socket path or unix:// URL; "" (or null) for no listing at all."""
    if value is None or value == "":
        return ""
    try:
        return endpoint_socket(value, "batchresource: runtime_endpoint")
    except ValueError as exc:
        raise HookConfigInvalid(str(exc)) from None


def _interval(value: object) -> float:
    """Seconds as a number, or a duration string ("10s", "500ms")."""
    try:
        if isinstance(value, str):
            seconds = parse_duration(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            raise ValueError(f"{shown(value)} is neither a number of seconds nor a duration")
    except ValueError as exc:
        raise HookConfigInvalid(f"batchresource: reconcile_interval: {exc}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise HookConfigInvalid(f"batchresource: reconcile_interval must be positive, got {shown(value)}")
    return seconds
