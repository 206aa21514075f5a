"""Assembling a proxy from its settings."""

from __future__ import annotations

import contextlib

from .config import ProxyConfig
from .server import Proxy
from .translate import V1OnlyFieldCheck


async def build_proxy(config: ProxyConfig, stack: contextlib.AsyncExitStack) -> Proxy:
    """A proxy with every feature wired in; stopped when ``stack`` closes."""
    stages = [V1OnlyFieldCheck()]
    proxy = Proxy(config, stages=stages)
    return proxy
