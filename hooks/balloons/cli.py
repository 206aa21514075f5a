"""``runtime-proxy hook balloons status``: the running balloons hook's balloons and containers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from runtimeproxy.clipath import SOCKET

from .status import read_status, render, status_socket_for


@click.group()
def balloons() -> None:
    """The balloons CPU-pinning hook."""


@balloons.command()
@click.option("--socket", "socket_path", type=SOCKET,
              help="The hook's socket, as given to 'hook run balloons'. [default: /run/runtime-proxy/hooks/balloons.sock]")
@click.option("--json", "as_json", is_flag=True, help="The status as JSON.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True, help="Seconds to wait for the answer.")
def status(socket_path: Path | None, as_json: bool, timeout: float) -> None:
    """Print the current balloons, their CPUs and their containers."""
    if socket_path is None:
        from hooks.cli import SOCKET_DIR  # here: hooks.cli imports this module

        socket_path = SOCKET_DIR / "balloons.sock"
    path = status_socket_for(socket_path)
    try:
        doc = asyncio.run(read_status(path, timeout))
    except (OSError, TimeoutError, ValueError) as exc:
        raise click.ClickException(
            f"no balloons hook answers on {path} ({exc.__class__.__name__}: {exc}); is 'runtime-proxy hook run balloons' running?"
        ) from None
    click.echo(json.dumps(doc, indent=2) if as_json else render(doc))
