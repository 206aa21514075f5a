"""``runtime-proxy nri``: the hook directory's servers as an NRI plugin."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from .. import eventloop, gcpolicy, logs
from ..clipath import PATH, SOCKET
from ..config import ConfigError, ProxyConfig, choices, parse_host_port
from .app import (
    DEFAULT_INDEX,
    DEFAULT_NAME,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SOCKET,
    NriPlugin,
    NriSettings,
)
from .plugin import Identity

log = logging.getLogger("runtimeproxy.nri")
_DEFAULTS = ProxyConfig()
_path = PATH


@click.command("nri")
@click.option("--hook-dir", type=_path, default=_DEFAULTS.hook_dir, show_default=True,
              help="Directory of hook server registrations (the same as for `serve`).")
@click.option("--nri-socket", type=SOCKET, default=DEFAULT_SOCKET, show_default=True,
              help="The runtime's NRI socket (ignored when the runtime started the plugin: NRI_PLUGIN_SOCKET).")
@click.option("--name", default=DEFAULT_NAME, show_default=True, help="Plugin name registered with the runtime.")
@click.option("--index", default=DEFAULT_INDEX, show_default=True,
              help="Plugin index, 00-99: plugins are called in index order.")
@click.option("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT, show_default=True,
              help="The runtime's plugin_request_timeout in seconds: hooks of one event must answer within it.")
@click.option("--metrics-listen", default=None, help="host:port to serve Prometheus metrics on. [default: off]")
@click.option("--event-loop", type=click.Choice(choices("event_loop")), default=_DEFAULTS.event_loop, show_default=True,
              help="auto: uvloop when installed, else asyncio's own (as for `serve`).")
@click.option("--log-format", type=click.Choice(choices("log_format")), default=_DEFAULTS.log_format, show_default=True)
@click.option("--log-level", type=click.Choice(choices("log_level")), default=_DEFAULTS.log_level, show_default=True)
def nri(
    hook_dir: Path, nri_socket: Path, name: str, index: str, request_timeout: float,
    metrics_listen: str | None, event_loop: str, log_format: str, log_level: str,
) -> None:
    """Serve the hook directory's servers to an NRI runtime (containerd 1.7+), without a proxy."""
    logs.setup(log_format, log_level)
    try:
        settings = NriSettings.from_environment(NriSettings(
            hook_dir=hook_dir, socket_path=nri_socket, name=name, index=index,
            request_timeout=request_timeout, metrics_listen=metrics_listen,
        ))
        Identity(settings.name, settings.index)
        if metrics_listen:  # as serve does, before anything starts (empty: off)
            parse_host_port(metrics_listen, "--metrics-listen")
        loop = eventloop.resolve(event_loop)
    except (ValueError, eventloop.EventLoopError) as exc:
        raise click.ClickException(str(exc)) from exc
    log.info("starting NRI plugin", extra={"plugin": settings.name, "index": settings.index,
                                           "socket": str(settings.socket_path), "fd": settings.socket_fd,
                                           "event_loop": loop})
    try:
        eventloop.run(_run(settings), loop)
    except KeyboardInterrupt:
        pass
    except ConfigError as exc:  # its message says it all (a metrics address it cannot serve on): no traceback
        log.error("fatal", extra={"error": str(exc)})
        sys.exit(1)
    except Exception as exc:
        log.exception("fatal", extra={"error": str(exc)})
        sys.exit(1)


async def _run(settings: NriSettings) -> None:
    from ..stopsignal import stop_on_signals

    stop = stop_on_signals()
    plugin = NriPlugin(settings)
    gcpolicy.before_serving()
    await plugin.run(stop)
