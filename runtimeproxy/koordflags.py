"""koord-runtime-proxy's flags on ``serve``, so that a unit or DaemonSet
carried over from it starts: its three endpoint flags are deprecated aliases
of ours (same meaning), its mode and skip-label flags are accepted where they
ask for what the proxy does anyway; each is logged as a warning naming what
to write instead. The rest is refused with the whole answer at once, not one
"no such option" at a time."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from .clipath import SOCKET
from .hookpath.executorbase import SKIP_LABEL

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class KoordFlag:
    """One of koord-runtime-proxy's flags: ``ours``, the flag of ours it is an
    alias of (given the same value), with ``note`` added to the deprecation
    warning; else ``what_we_do``, the one value accepted (what the proxy does
    anyway), ``note`` why any other is refused, ``refused`` why some are where
    ``note`` does not say."""

    ours: str | None = None
    note: str = ""
    what_we_do: str = ""
    refused: Mapping[str, str] = field(default_factory=dict)


_SKIP = "none: pods labelled runtimeproxy.koordinator.sh/skip-hookserver=true are never hooked, and no flag changes it"
_CRI = "none: the proxy speaks CRI to any CRI runtime"
KOORD_FLAGS: dict[str, KoordFlag] = {
    "--koord-runtimeproxy-endpoint": KoordFlag("--listen"),
    "--remote-runtime-service-endpoint": KoordFlag("--backend"),
    "--remote-image-service-endpoint": KoordFlag(
        "--image-backend",
        "; leave it out when it is the runtime's socket, or where koord-runtime-proxy (v1.4 and later)"
        " sent image calls to the runtime's socket whatever it said",
    ),
    "--backend-runtime-mode": KoordFlag(
        note=f"{_CRI}; only Containerd is accepted", what_we_do="Containerd",
        refused={"Docker": f"{_CRI}; Docker mode is not supported"},
    ),
    "--runtime-hook-server-key": KoordFlag(note=_SKIP, what_we_do=SKIP_LABEL),
    "--runtime-hook-server-val": KoordFlag(note=_SKIP, what_we_do="true"),
}
_IMAGE = "--remote-image-service-endpoint"
_GIVEN = "koord_flags"


def _collect(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value is not None:
        ctx.meta.setdefault(_GIVEN, []).append((f"--{(param.name or '').replace('_', '-')}", value))


def koord_flags(f: F) -> F:
    """Hidden options for KOORD_FLAGS, collected for :func:`koord_aliases`."""
    for flag in reversed(KOORD_FLAGS):
        kind = SOCKET if KOORD_FLAGS[flag].ours else None
        f = click.option(flag, hidden=True, default=None, type=kind, expose_value=False, callback=_collect)(f)
    return f


def koord_aliases(ctx: click.Context, flags: dict[str, object]) -> list[str]:
    """Fill ``flags`` (serve's, by parameter name) from the koord-runtime-proxy
    aliases given; the deprecation warnings to log. A usage error naming each
    flag that cannot be taken (and its replacement), or an alias given with
    its replacement set otherwise."""
    warnings, refused = [], []
    for flag, value in ctx.meta.get(_GIVEN, ()):
        koord = KOORD_FLAGS[flag]
        ours = koord.ours
        if ours is None:
            if value == koord.what_we_do:
                warnings.append(f"{flag}={value} is deprecated: it is what the proxy does; remove it")
            else:
                refused.append(f"  {flag}={value}: {koord.refused.get(value, koord.note)}; remove it")
            continue
        name = ours.removeprefix("--").replace("-", "_")
        given = flags.get(name)
        if given is not None and not _same_socket(given, value):
            refused.append(f"  {flag}={value}: {ours} {given} is given too; give {ours} alone")
            continue
        if given is None:
            flags[name] = value
        warnings.append(f"{flag} is deprecated: use {ours} {value}{koord.note}")
    if refused:
        raise click.UsageError(
            "koord-runtime-proxy's flags are not all runtime-proxy's (docs/migrating-from-koord-runtime-proxy.md):\n"
            + "\n".join(refused)
        )
    return warnings


def image_calls_moved(ctx: click.Context, backend: Path | None) -> str | None:
    """The warning for koord-runtime-proxy's image endpoint naming another
    socket than the runtime's (``backend``, as configured): the proxy sends
    image calls there, where koord-runtime-proxy v1.4 and later ignored it."""
    for flag, value in ctx.meta.get(_GIVEN, ()):
        if flag == _IMAGE and backend is not None and not _same_socket(value, backend):
            return (
                f"{flag}={value} is applied: image calls now go to {value}, not to the runtime's socket {backend},"
                " unlike koord-runtime-proxy v1.4 and later, which ignored this flag and sent them to the runtime"
                " endpoint; remove it to keep them there"
            )
    return None


def _same_socket(a: Any, b: Any) -> bool:
    """Whether two socket paths name one socket (``/var/run/x`` and ``/run/x``
    where /var/run links to /run), as both checks here compare them."""
    return bool(os.path.realpath(a) == os.path.realpath(b))
