"""``runtime-proxy``: command line."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from hooks.cli import hook as hook_commands

from . import eventloop, gcpolicy, logs
from .checkconfig import check_config_command
from .clipath import PATH, SOCKET
from .config import (
    MIB, SERVE_VERSIONS_FORMS, ConfigError, ConfigWarning, ProxyConfig, check_file, choices, file_error, given_in, refusal,
)
from .endpointurl import endpoint_path
from .koordflags import image_calls_moved, koord_aliases, koord_flags
from .nri.cli import nri as nri_command
from .socketclash import distinct_sockets

if TYPE_CHECKING:
    from .app import RunningProxy
    from .host.containerd import LocalContainerd

log = logging.getLogger("runtimeproxy")
F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def main() -> None:
    """A transparent CRI proxy that calls resource hooks around lifecycle calls."""


_DEFAULTS = ProxyConfig()


def _given(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """None unless the flag was on the command line: the config file fills in what flags leave out."""
    return None if ctx.get_parameter_source(param.name or "") is ParameterSource.DEFAULT else value


def _setting(flag: str, help: str, setting: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """A flag for a ProxyConfig setting (by default the flag's name, - read as _):
    its default and choices come from ProxyConfig, and --help shows them."""
    setting = setting or flag.removeprefix("--").replace("-", "_")
    if choices(setting):
        kwargs.setdefault("type", click.Choice(choices(setting)))
    kwargs.setdefault("show_default", True)
    return click.option(flag, default=getattr(_DEFAULTS, setting), callback=_given, help=help, **kwargs)


@main.command()
@click.option("--config", "config_file", type=PATH, help="YAML file with the same settings; flags win.")
@_setting("--listen", "Unix socket kubelet connects to.", type=SOCKET)
@_setting("--backend", "containerd's CRI socket.", type=SOCKET)
@_setting("--image-backend", "Socket for the ImageService, when not the backend's.", type=SOCKET)
@click.option(
    "--local-containerd",
    type=PATH,
    help="Start a private containerd with its state under this directory and use it as the backend "
    "(for trying the proxy out; production nodes use --backend).",
)
@_setting("--hook-dir", "Directory of hook server registrations.", type=PATH)
@_setting("--serve-versions", " | ".join(SERVE_VERSIONS_FORMS))
@_setting("--backend-version", "Force the CRI version spoken to the backend.")
@_setting(
    "--unknown-fields",
    "For a v1alpha2 runtime: refuse v1 requests with fields newer than the proxy's CRI schema, "
    "or forward them (the runtime ignores them).",
)
@_setting(
    "--max-message-size",
    f"Message size limit in bytes, both directions. [default: {_DEFAULTS.max_recv_message_bytes // MIB} MiB]",
    setting="max_recv_message_bytes",
    type=int,
    show_default=False,  # in MiB, in the help text
)
@_setting("--max-concurrent-streams", "Calls one client connection may have open at once.", type=int)
@_setting(
    "--data-path",
    "grpc: every call through grpc.aio; frames: calls that need no hook relayed frame by frame (faster).",
)
@_setting(
    "--event-loop",
    "auto: uvloop when installed, else asyncio's own; uvloop: a faster loop for the same asyncio code.",
)
@_setting("--grace-period", "Seconds in-flight calls get on SIGTERM.", type=float)
@_setting("--metrics-listen", "host:port to serve Prometheus metrics on. [default: off]", show_default=False)
@_setting("--log-format", "Log line format.")
@_setting("--log-level", "Lowest level logged.")
@koord_flags
def serve(
    config_file: Path | None,
    local_containerd: Path | None,
    max_message_size: int | None,
    **flags: object,
) -> None:
    """Serve CRI on --listen, forwarding to --backend."""
    deprecated = koord_aliases(click.get_current_context(), flags)
    try:
        serving = _settings(config_file, local_containerd, max_message_size, flags)
        config, loop, warnings = serving.config, serving.loop, serving.warnings
        moved = image_calls_moved(click.get_current_context(), config.backend)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    logs.setup(config.log_format, config.log_level)
    log.info("starting", extra={"config_file": str(config_file) if config_file else None})
    for warning in deprecated:  # koord-runtime-proxy's flags, taken
        log.warning("deprecated koord-runtime-proxy flag", extra={"warning": warning})
    if moved is not None:
        log.warning("image calls go to another socket than koord-runtime-proxy sent them to", extra={"warning": moved})
    for slip in warnings:  # accepted, but likely a slip
        log.warning(
            "config file warning", extra={"config_file": str(config_file), "line": slip.line, "warning": slip.message}
        )
    try:
        eventloop.run(_serve(config, local_containerd), loop)
    except KeyboardInterrupt:
        pass
    except _operator_errors() as exc:  # their message says it all: no traceback
        log.error("fatal", extra={"error": str(exc)})
        sys.exit(1)
    except Exception as exc:
        log.exception("fatal", extra={"error": str(exc)})
        sys.exit(1)


@dataclasses.dataclass(frozen=True)
class _Serving:
    """What serve runs with, once every setting is checked."""

    config: ProxyConfig
    loop: str  # the event loop config.event_loop resolves to here: asyncio or uvloop
    warnings: tuple[ConfigWarning, ...]  # the config file's: accepted, likely a slip


def _settings(
    config_file: Path | None, local_containerd: Path | None, max_message_size: int | None, flags: dict[str, object],
) -> _Serving:
    """The config file with the flags over it, and the event loop it names;
    a ConfigError naming every problem serve refuses, as check-config does
    (check_file), not the first only: the file's, then the flags'. With
    --local-containerd and a backend named besides among them, a
    click.UsageError (exit 2, as that misuse of the command line alone)."""
    checked = check_file(config_file) if config_file is not None else None
    problems = list(checked.errors) if checked is not None else []
    flag_problems: list[ConfigError] = []
    settings = checked.settings if checked is not None else ProxyConfig()  # a refused setting at its default
    given = {name for name, value in flags.items() if value is not None}
    try:
        config = settings.with_overrides(
            **flags, max_recv_message_bytes=max_message_size, max_send_message_bytes=max_message_size,
        )
    except ConfigError as exc:  # a flag's value: nothing is built to check further
        raise refusal(config_file, problems, [exc]) from exc
    # A socket setting refused is at its default: a clash would be no one's.
    socket_settings_known = checked is None or not (checked.refused & {"listen", "backend", "image_backend"}) - given
    other_backends = _other_backends(config_file, flags) if local_containerd is not None else None
    if other_backends is not None:
        flag_problems.append(other_backends)
    elif local_containerd is None and socket_settings_known:
        try:
            distinct_sockets(config, config_file, given)
        except ConfigError as exc:
            (flag_problems if exc.key in given else problems).append(exc)
    try:
        loop = eventloop.resolve(config.event_loop)
    except eventloop.EventLoopError as exc:  # uvloop asked for and missing
        loop = "asyncio"
        if "event_loop" in given:
            flag_problems.append(ConfigError(str(exc), key="event_loop"))
        else:
            problems.append(file_error(config_file, "event_loop", eventloop.UVLOOP_REFUSED) if config_file is not None
                            else ConfigError(eventloop.UVLOOP_REFUSED, key="event_loop"))
    if problems or flag_problems:
        refused = refusal(config_file, problems, flag_problems)
        if other_backends is not None:
            raise click.UsageError(str(refused))
        raise refused
    return _Serving(config, loop, checked.warnings if checked is not None else ())


def _other_backends(config_file: Path | None, flags: dict[str, object]) -> ConfigError | None:
    """--local-containerd serves runtime and images alike: a backend named
    elsewhere would split them between two containerds, or be dropped unseen."""
    given = [f"--{name.replace('_', '-')}" for name in ("backend", "image_backend") if flags.get(name) is not None]
    try:
        in_file = sorted(given_in(config_file).keys() & {"backend", "image_backend"})
    except ConfigError:  # the file unread: that error is listed already
        in_file = []
    given += [f"{name.replace('_', '-')} in {config_file}" for name in in_file]
    if not given:
        return None
    return ConfigError(f"--local-containerd serves runtime and images from its own containerd; remove {', '.join(given)}")


def _operator_errors() -> tuple[type[Exception], ...]:
    """Errors whose message tells the operator all there is (a path, a
    directory, a socket from systemd): logged in one line, no traceback."""
    from .cripath.activation import ActivationError
    from .host.containerd import LocalRuntimeError
    from .host.unixsocket import ListenError, UnixSocketError

    return (LocalRuntimeError, ConfigError, ListenError, ActivationError, UnixSocketError)


async def _serve(config: ProxyConfig, local_dir: Path | None) -> None:
    from .app import build_proxy
    from .cripath.activation import inherited_socket
    from .host.process import exit_status
    from .stopsignal import stop_on_signals

    log.info("event loop running", extra={"event_loop": eventloop.running_loop_name(), "setting": config.event_loop})
    stop = stop_on_signals()
    listen_socket = inherited_socket()  # first: a child started below must not see LISTEN_FDS
    died: BaseException | None = None  # the private containerd's exit, if it is why serve ends
    running: RunningProxy | None = None

    def containerd_exited(exited: asyncio.Future[int], runtime: LocalContainerd, pid: int | None) -> None:
        # Whenever it comes: while the proxy starts, serves or stops (until the
        # stack cancels the watch, before containerd's own stop).
        nonlocal died
        if exited.cancelled():
            return
        if (error := exited.exception()) is not None:  # a watcher's bug must not pass for a stop, exit 0
            died = died or error
            stop.end("watching the private containerd failed")
        elif stop.received is not None:  # `systemctl stop` (KillMode=control-group) signals containerd too, at once
            log.info("the private containerd exited with the stop signal",  # the signal was logged as it came
                     extra={"pid": pid, "status": exit_status(exited.result())})
        elif not stop.is_set() and not (running is not None and running.tasks.failed.is_set()):
            # Its error is raised once the stack stopped the proxy, then it.
            died = _private_containerd_died(runtime, pid, exited.result())
            stop.end("the private containerd exited")

    async with contextlib.AsyncExitStack() as stack:
        if local_dir is not None:
            from .host.containerd import LocalContainerd

            runtime = await stack.enter_async_context(LocalContainerd(local_dir, die_with_parent=True))
            # Watched from now: an exit while the proxy starts (a wait for the path's lock, say) ends serve too.
            exited = asyncio.ensure_future(runtime.wait_exit())
            # started_pid, not pid: None once it exited, as it may have already
            exited.add_done_callback(functools.partial(containerd_exited, runtime=runtime, pid=runtime.started_pid))
            stack.callback(exited.cancel)  # before containerd's stop, on every way out
            # replace, not with_overrides: None (images from the backend) must clear a value
            config = dataclasses.replace(config, backend=runtime.socket, image_backend=None)
            _tell_local_usage(config, runtime.socket)
        gcpolicy.before_serving()
        running = await stop.unless_signalled(build_proxy(config, stack, listen_socket))
        if running is not None:  # None: a signal, or containerd's exit, while it started: nothing serves
            await _first(stop.wait(), running.tasks.failed.wait())
            if not stop.is_set():
                log.error("shutting down: a background task the proxy needs kept failing")
    if died is not None:
        raise died  # after the orderly stop: exit non-zero, for systemd or the operator to restart both
    if running is not None and running.tasks.error is not None:
        raise running.tasks.error  # after the orderly stop: exit non-zero


def _private_containerd_died(runtime: LocalContainerd, pid: int | None, returncode: int) -> Exception:
    """The error serve ends with once the private containerd exited (logged
    now): the proxy owns it and does not restart it, so serving on would only
    answer UNAVAILABLE; serve stops in order instead (the proxy, then the
    clean-up of what containerd left: shims, mounts)."""
    from .host.containerd import LocalRuntimeError
    from .host.process import exit_status

    status = exit_status(returncode)
    tail = runtime.log_tail()  # before the clean-up adds to it
    log.error("shutting down: the private containerd exited", extra={"pid": pid, "status": status,
                                                                      "log": str(runtime.log_path)})
    return LocalRuntimeError(
        f"the private containerd (pid {pid}) exited: {status}; it is not restarted, restart runtime-proxy serve "
        f"(its log {runtime.log_path} ends:\n{tail})")


def _tell_local_usage(config: ProxyConfig, containerd: Path) -> None:
    """How to use a --local-containerd run: for a person, or one JSON line (stderr is the log's)."""
    endpoint = f"unix://{config.listen}"
    crictl = f"crictl --runtime-endpoint {endpoint} --image-endpoint {endpoint} version"
    status = f"runtime-proxy status --listen {config.listen}"
    kubelet = f"kubelet --container-runtime-endpoint={endpoint}"
    if config.log_format == "json":  # at any --log-level, as the text
        logs.always(log, "private containerd ready; point clients at the proxy", containerd=str(containerd),
                    endpoint=endpoint, hook_dir=str(config.hook_dir), crictl=crictl, kubelet=kubelet, status=status)
        return
    click.echo(
        f"private containerd at {containerd}\n"
        f"point clients at the proxy:\n"
        f"  {crictl}\n"
        f"  {kubelet}\n"
        f"hook servers register in {config.hook_dir} (--hook-dir); what it serves and calls:\n"
        f"  {status}",
        err=True,
    )


async def _first(*waits: Awaitable[Any]) -> None:
    """Return when the first of ``waits`` is done; the others are cancelled.
    A wait that ended in an error raises it (a watcher's bug must not pass
    for a stop, exit 0)."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    for task in done:
        if not task.cancelled():
            task.result()


@main.command()
@click.option(
    "--config", "config_file", type=PATH,
    help="The YAML config file serve was started with: the proxy's socket is its listen; --listen wins.",
)
@_setting("--listen", "The proxy's socket.", type=SOCKET)
@click.option("--json", "as_json", is_flag=True, help="The whole status as one JSON document.")
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Seconds to wait for the answer.")
def status(config_file: Path | None, listen: Path | None, as_json: bool, timeout: float) -> None:
    """Ask the running proxy on --listen what it serves: backend, versions, hook servers, calls."""
    import json

    from grpc import aio

    from .admin import fetch_status, render, unreachable
    from .config import load
    from .host.unixsocket import UnixSocketError

    relative = None  # the config's listen as written, when relative: taken from here, not from serve's directory
    try:  # as serve reads it: the file, then the flag
        loaded = load(config_file)
    except ConfigError as exc:
        why = exc.__cause__
        problem = (f"cannot read {config_file}: {why.strerror or why}" if isinstance(why, OSError)
                   else f"{exc} (serve would not start with it)")
        if listen is None:  # a file serve would refuse is refused: its listen is no socket serve listens on
            raise click.ClickException(f"{problem}; give --listen PATH") from exc
        click.echo(f"warning: {problem}; asking --listen {listen}", err=True)  # the flag wins: the file names nothing asked
    else:
        if listen is None and config_file is not None:
            listen, relative = loaded.listen, _relative(given_in(config_file).get("listen"))
        listen = listen or loaded.listen
    try:
        doc = asyncio.run(fetch_status(listen, timeout))
    except aio.AioRpcError as exc:
        raise click.ClickException(unreachable(listen, exc, timeout, config_file=config_file, relative=relative)) from None
    except UnixSocketError as exc:  # a path grpc cannot dial (a comma)
        raise click.ClickException(f"cannot get the status from the proxy at {listen}: {exc}") from None
    click.echo(json.dumps(doc, indent=2, sort_keys=True) if as_json else render(doc))


def _relative(listen: object) -> str | None:
    """``listen`` as a config file writes it, if a relative path (from the current directory)."""
    if not isinstance(listen, str):
        return None
    return None if os.path.isabs(os.path.expanduser(endpoint_path(listen))) else listen


main.add_command(hook_commands)
main.add_command(check_config_command)
main.add_command(nri_command)

if __name__ == "__main__":
    main()
