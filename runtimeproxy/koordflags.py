"""koord-runtime-proxy's flags, which ``serve`` refuses naming what replaces
each: a unit or DaemonSet carried over from it fails with the whole answer
at once, not one "no such option" at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_SKIP = "none: pods labelled runtimeproxy.koordinator.sh/skip-hookserver=true are never hooked, and no flag changes it"
# Flag -> the replacement: a flag of ours (given the same value), or why there is none.
KOORD_FLAGS: dict[str, tuple[str | None, str]] = {
    "--koord-runtimeproxy-endpoint": ("--listen", ""),
    "--remote-runtime-service-endpoint": ("--backend", ""),
    "--remote-image-service-endpoint": ("--image-backend", "; leave it out when it is the runtime's socket"),
    "--backend-runtime-mode": (None, "none: the proxy speaks CRI to any CRI runtime; Docker mode is not supported"),
    "--runtime-hook-server-key": (None, _SKIP),
    "--runtime-hook-server-val": (None, _SKIP),
}
_GIVEN = "koord_flags"


def _collect(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta.setdefault(_GIVEN, []).append((f"--{(param.name or '').replace('_', '-')}", value))


def koord_flags(f: F) -> F:
    """Hidden options for KOORD_FLAGS, collected for :func:`refuse_koord_flags`."""
    for flag in reversed(KOORD_FLAGS):
        f = click.option(flag, hidden=True, default=None, expose_value=False, callback=_collect)(f)
    return f


def refuse_koord_flags(ctx: click.Context) -> None:
    """A usage error naming each koord-runtime-proxy flag given and its replacement."""
    given = ctx.meta.get(_GIVEN)
    if not given:
        return
    lines = []
    for flag, value in given:
        ours, note = KOORD_FLAGS[flag]
        lines.append(f"  {flag}={value}: " + (f"use {ours} {value}{note}" if ours else f"{note}; remove it"))
    raise click.UsageError(
        "koord-runtime-proxy's flags are not runtime-proxy's (docs/migrating-from-koord-runtime-proxy.md):\n"
        + "\n".join(lines)
    )
