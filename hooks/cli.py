"""``runtime-proxy hook``: serve a built-in hook server (``run``) or name them (``list``).

``hook run`` owns a built-in hook's lifecycle: build it from its config, serve
it, register it in the hook directory, run its background work beside it, and
on SIGTERM/SIGINT take the registration away *before* the server stops, so
the proxy stops calling a server that is about to go.

Exit codes: 0 after an orderly stop; 1 when the server cannot serve (its
socket in use, its directory read-only or not writable for now) or its
background work failed, which a restart may cure; 2 when the hook or its
settings are wrong (an unknown name, a bad config, a socket path nothing can
listen at), which no restart can cure.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml

from runtimeproxy import eventloop, gcpolicy, logs, yamlkeys
from runtimeproxy.clipath import PATH, SOCKET
from runtimeproxy.hookpath.hookfile import (
    DEFAULT_HOOK_DIR,
    MAX_TIMEOUT,
    FailurePolicy,
    parse_duration,
)
from runtimeproxy.host import sdnotify
from runtimeproxy.stopsignal import stop_on_signals

from .balloons.cli import balloons as balloons_commands
from .builtin import (
    BuiltinHook,
    BuiltinUnavailable,
    HookConfigInvalid,
    describe_builtins,
    load_builtin,
)
from .runscope import FileIdentity, remove_if_ours
from .sdk import DEFAULT_DRAIN_S, TRANSPORTS, HookServerError, SocketPathError, write_hook_config

log = logging.getLogger("hooks.run")

EXIT_FAILED = 1
EXIT_SETUP = 2
SOCKET_DIR = Path("/run/runtime-proxy/hooks")


class SetupError(click.ClickException):
    """The hook cannot be built as asked; restarting will not help."""

    exit_code = EXIT_SETUP


@dataclass
class Registration:
    """The hook's file in the hook directory, written and removed by ``hook run``."""

    directory: Path
    name: str
    failure_policy: str
    timeout: str | None
    priority: int | None
    _identity: FileIdentity | None = field(default=None, init=False)  # as written: another writer's differs
    left: bool = field(default=False, init=False)  # remove failed: the file stays, the proxy goes on calling

    @property
    def path(self) -> Path:
        return self.directory / f"{self.name}.json"

    def write(self, hook: BuiltinHook) -> None:
        """Write (or replace a stale) registration naming ``hook``'s socket and hook points."""
        if self.priority is None:
            self.priority = hook.PRIORITY
        existed = self.directory.is_dir()
        path = write_hook_config(  # at debug: _serve logs "hook registered", with the hook and its event loop
            self.directory, self.name, hook.socket_path, hook.HOOKS, self.failure_policy, self.timeout, self.priority,
            log_level=logging.DEBUG,
        )
        self._identity = FileIdentity.of(os.stat(path))
        if not existed:  # a mistyped --hook-dir would otherwise be created and served in silence
            log.warning(
                "hook directory %s did not exist and was created: a proxy reads hook files only from its own"
                " hook-dir (default %s); check it is this one",
                self.directory,
                DEFAULT_HOOK_DIR,
                extra={"hook_dir": str(self.directory)},
            )

    def remove(self) -> bool:
        """Remove the file this process wrote; one that another writer has put
        in its place since is left alone. True if a file was removed."""
        identity, self._identity = self._identity, None
        if identity is None:
            return False
        try:
            outcome = remove_if_ours(self.path, identity)
        except OSError as exc:  # a hook directory gone read-only, say: the stop goes on without it
            self.left = True
            log.error(
                "cannot remove the registration: the proxy goes on calling this hook server, under its failure"
                " policy, until the file is removed", extra={"hook_file": str(self.path), "error": str(exc)},
            )
            return False
        if outcome == "replaced":
            log.warning("registration was replaced by another writer; leaving it", extra={"hook_file": str(self.path)})
        return outcome == "removed"


@click.group()
def hook() -> None:
    """Built-in hook servers."""


def _timeout(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # Checked before the server starts, so a typo never binds a socket.
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not 0 < seconds <= MAX_TIMEOUT:
        raise click.BadParameter(f"{value!r} must be more than 0 and at most {MAX_TIMEOUT:g}s")
    return value


@hook.command()
@click.argument("name")
@click.option("--socket", "socket_path", type=SOCKET, help=f"Unix socket to serve on. [default: {SOCKET_DIR}/NAME.sock]")
@click.option("--hook-dir", type=PATH, default=DEFAULT_HOOK_DIR, show_default=True, help="Where the registration file NAME.json goes (the proxy's --hook-dir).")
@click.option("--failure-policy", type=click.Choice([p.value for p in FailurePolicy]), default=FailurePolicy.IGNORE.value, show_default=True, help="What the proxy does when this hook fails.")
@click.option("--timeout", callback=_timeout, help="Bound of one hook call, e.g. 500ms. [default: the proxy's]")
@click.option("--priority", type=int, help="Order among hook servers, lower first. [default: the hook's own (balloons: 100), else the proxy's]")
@click.option("--config", "config_file", type=PATH, help="YAML settings of the hook. [default: none]")
@click.option("--drain", type=click.FloatRange(min=0), default=DEFAULT_DRAIN_S, show_default=True, help="Seconds the server keeps answering after its registration is removed, while the proxy notices.")
@click.option("--event-loop", type=click.Choice(eventloop.EVENT_LOOPS), default="auto", show_default=True, help="auto: uvloop when installed, else asyncio's own.")
@click.option("--transport", type=click.Choice(TRANSPORTS), default="frames", show_default=True, help="frames: the SDK's own HTTP/2 transport, about half grpc.aio's CPU per call; grpc: grpc.aio.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
def run(
    name: str,
    socket_path: Path | None,
    hook_dir: Path,
    failure_policy: str,
    timeout: str | None,
    priority: int | None,
    config_file: Path | None,
    drain: float,
    event_loop: str,
    transport: str,
    log_format: str,
    log_level: str,
) -> None:
    """Serve built-in hook NAME and register it in --hook-dir until SIGTERM."""
    logs.setup(log_format, log_level)
    cls = _load(name)
    config = _load_config(config_file)
    registration = Registration(hook_dir, name, failure_policy, timeout, priority)
    try:
        loop = eventloop.resolve(event_loop)
    except eventloop.EventLoopError as exc:
        raise SetupError(str(exc)) from exc
    try:
        serving = _serve(cls, socket_path or SOCKET_DIR / f"{name}.sock", config, registration, drain, config_file,
                         transport)
        code = eventloop.run(serving, loop)
        if registration.left:  # an orderly stop otherwise: a failed one for systemd, which shows it
            code = code or EXIT_FAILED
    except SetupError:
        raise
    except Exception as exc:
        log.exception("fatal", extra={"hook": name, "error": str(exc)})
        code = EXIT_FAILED
    sys.exit(code)


hook.add_command(balloons_commands)


@hook.command("list")
def list_() -> None:
    """Name the built-in hooks, what each does and the hook points it handles."""
    for info in describe_builtins():
        if info.unavailable is not None:
            click.echo(f"{info.name}\tunavailable: {info.unavailable}")
        else:
            hooks = ", ".join(h.value for h in info.hooks)
            click.echo(f"{info.name}\t{info.summary}\n\thooks: {hooks}")


def _load_config(path: Path | None) -> Mapping[str, Any]:
    if path is None:
        return {}
    try:
        parsed = yamlkeys.Document(path.read_text())
        doc = parsed.value()
        repeats = parsed.repeats()
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SetupError(f"cannot read hook config {path}: {exc}") from exc
    except RecursionError:
        raise SetupError(f"cannot read hook config {path}: YAML nested too deeply") from None
    if doc is None:  # an empty file: no settings
        return {}
    if not isinstance(doc, dict):
        raise SetupError(f"hook config {path}: expected a mapping of settings at the top level, got {type(doc).__name__}")
    # A key given twice: YAML keeps the last without a word (as for the proxy's config).
    yamlkeys.check_repeats(
        repeats,
        lambda repeat: SetupError(f"hook config {path}: {repeat}"),
        lambda repeat: log.warning(
            "hook config warning", extra={"config_file": str(path), "line": repeat.line, "warning": str(repeat)}
        ),
    )
    return doc


def _load(name: str) -> type[BuiltinHook]:
    try:
        return load_builtin(name)
    except (LookupError, BuiltinUnavailable) as exc:
        raise SetupError(str(exc)) from exc


async def _serve(
    cls: type[BuiltinHook], socket_path: Path, config: Mapping[str, Any], registration: Registration, drain: float,
    config_file: Path | None = None, transport: str = "frames",
) -> int:
    stop = stop_on_signals()
    try:
        # Built in the loop: a hook may make loop-bound objects (channels, events) as it is built.
        server = cls.from_config(str(socket_path), config)
    except HookConfigInvalid as exc:  # the file to fix, as a unit passes it only when it exists
        raise SetupError(f"hook {cls.NAME}: config {config_file or '(no --config given)'}: {exc}") from exc
    except ValueError as exc:  # e.g. a socket path too long
        raise SetupError(f"hook {cls.NAME}: {exc}") from exc
    server.config_file = config_file
    server.transport = transport
    fields: dict[str, object] = {"hook": server.NAME, "socket": server.socket_path, "hook_file": str(registration.path)}
    gcpolicy.before_serving()
    try:
        await stop.unless_signalled(server.start())  # a signal in its wait for the path's lock ends it
    except SocketPathError as exc:  # exit 2: a unit restarting on failure would retry it forever
        raise SetupError(f"hook {server.NAME}: {exc}") from exc
    except HookServerError as exc:
        log.error("cannot serve", extra={**fields, "error": str(exc)})
        return EXIT_FAILED
    background: asyncio.Task[None] | None = None
    try:
        if stop.is_set():  # a signal during start-up (logged as it came, stopsignal.py): do not register at all
            return 0
        try:
            registration.write(server)
        except ValueError as exc:
            raise SetupError(f"hook {server.NAME}: cannot register: {exc}") from exc
        except OSError as exc:  # e.g. a read-only or foreign hook directory
            log.error("cannot register", extra={**fields, "error": str(exc)})
            return EXIT_FAILED
        log.info(
            "hook registered",
            extra={
                **fields,
                "event_loop": eventloop.running_loop_name(),
                "hooks": ",".join(h.value for h in server.HOOKS),
                "failure_policy": registration.failure_policy,
                "timeout": registration.timeout,
                "priority": registration.priority,
            },
        )
        _notify_systemd("READY=1")
        background = asyncio.create_task(server.background(), name=f"{server.NAME}-background")
        return await _until_stopped(stop, background, fields)
    finally:
        _notify_systemd("STOPPING=1")
        if registration.remove():  # first: the proxy stops calling us
            log.info("registration removed", extra=fields)
            await asyncio.sleep(drain)  # calls the proxy started before it noticed still get answers
        await server.stop()
        if background is not None:
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
        log.info("stopped", extra=fields)


async def _until_stopped(stop: asyncio.Event, background: asyncio.Task[None], fields: dict[str, object]) -> int:
    """Wait for a signal or for the background work to fail; the exit code."""
    signalled = asyncio.create_task(stop.wait(), name="signal")
    try:
        await asyncio.wait({signalled, background}, return_when=asyncio.FIRST_COMPLETED)
        if background.done() and not background.cancelled() and background.exception() is None:
            log.debug("background work finished; serving on", extra=fields)
            await signalled
    finally:
        signalled.cancel()
    if background.done():
        error = background.exception() if not background.cancelled() else asyncio.CancelledError("cancelled")
        if error is not None:
            log.error("background work failed; shutting down", exc_info=error, extra={**fields, "error": repr(error)})
            return EXIT_FAILED
    return 0  # a stop signal: logged as it came (stopsignal.py)


def _notify_systemd(state: str) -> None:
    """sd_notify: lets a ``Type=notify`` unit order the proxy after the registration."""
    sdnotify.notify(state)
