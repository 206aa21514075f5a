"""``runtime-proxy``: command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click

from . import logs
from .config import ConfigError, ProxyConfig, load

log = logging.getLogger("runtimeproxy")


@click.group()
def main() -> None:
    """A transparent CRI proxy that calls resource hooks around lifecycle calls."""


_path = click.Path(path_type=Path)


@main.command()
@click.option("--config", "config_file", type=_path, help="YAML file with the same settings; flags win.")
@click.option("--listen", type=_path, help="Unix socket kubelet connects to. [default: /var/run/runtime-proxy/runtime-proxy.sock]")
@click.option("--backend", type=_path, help="containerd's CRI socket. [default: /run/containerd/containerd.sock]")
@click.option("--image-backend", type=_path, help="Socket for the ImageService, when not the backend's.")
@click.option(
    "--local-containerd",
    type=_path,
    help="Start a private containerd with its state under this directory and use it as the backend "
    "(for trying the proxy out; production nodes use --backend).",
)
@click.option("--hook-dir", type=_path, help="Directory of hook server registrations. [default: /etc/runtime/hookserver.d]")
@click.option("--serve-versions", help="auto | v1 | v1alpha2 | v1,v1alpha2 [default: auto]")
@click.option("--backend-version", type=click.Choice(["v1", "v1alpha2"]), help="Force the CRI version spoken to the backend.")
@click.option(
    "--unknown-fields",
    type=click.Choice(["refuse", "forward"]),
    help="For a v1alpha2 runtime: refuse v1 requests with fields newer than the proxy's CRI schema, "
    "or forward them (the runtime ignores them). [default: refuse]",
)
@click.option("--max-message-size", type=int, help="Message size limit in bytes, both directions. [default: 16 MiB]")
@click.option("--grace-period", type=float, help="Seconds in-flight calls get on SIGTERM. [default: 10]")
@click.option("--metrics-listen", help="host:port to serve Prometheus metrics on. [default: off]")
@click.option("--log-format", type=click.Choice(["text", "json"]))
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
def serve(
    config_file: Path | None,
    local_containerd: Path | None,
    max_message_size: int | None,
    **flags: object,
) -> None:
    """Serve CRI on --listen, forwarding to --backend."""
    try:
        config = load(config_file).with_overrides(
            **flags,
            max_recv_message_bytes=max_message_size,
            max_send_message_bytes=max_message_size,
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    logs.setup(config.log_format, config.log_level)
    log.info("starting", extra={"config_file": str(config_file) if config_file else None})
    try:
        asyncio.run(_serve(config, local_containerd))
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        log.exception("fatal", extra={"error": str(exc)})
        sys.exit(1)


async def _serve(config: ProxyConfig, local_dir: Path | None) -> None:
    from .app import build_proxy
    from .cripath.server import stop_on_signals

    stop = stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        if local_dir is not None:
            from .host.containerd import LocalContainerd

            runtime = await stack.enter_async_context(LocalContainerd(local_dir))
            config = config.with_overrides(backend=runtime.socket)
            click.echo(
                f"private containerd at {runtime.socket}\n"
                f"point clients at the proxy:\n"
                f"  crictl --runtime-endpoint unix://{config.listen} --image-endpoint unix://{config.listen} version\n"
                f"  kubelet --container-runtime-endpoint=unix://{config.listen}",
                err=True,
            )
        running = await build_proxy(config, stack)
        failed = running.tasks.failed
        await _first(stop.wait(), failed.wait())
        if failed.is_set():
            log.error("shutting down: a background task the proxy needs kept failing")
        else:
            log.info("signal received, shutting down")
    if running.tasks.error is not None:
        raise running.tasks.error  # after the orderly stop: exit non-zero


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Return when the first of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


if __name__ == "__main__":
    main()
