"""``runtime-proxy check-config``: the settings and the hook directory, checked
by the very code ``serve`` runs (:func:`.config.check_file`, which ``serve``
refuses a config file with too, the hook registry's reload with its directory
and permission rules, :func:`.hookfile.parse_hook_file`), every problem found
in one run, the probes' (sockets, addresses) too: an operator fixes them all
in one pass (the hook directory: :mod:`.checkhooks`).

What ``serve`` would refuse is an *error*. What ``serve`` accepts but is likely
a mistake is a *warning*: a config key given twice with the same value, a
grace period the shipped unit's stop timeout cuts short, a socket that does
not exist right now (its server
may simply not be up yet), a hook file that registers nothing, a hook point
the proxy never calls, a key a hook file carries that nothing reads (a typo
of ``timeout`` would silently leave the default in force), a metrics host
whose lookup gave no answer.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from . import eventloop
from .checkfindings import Finding, Severity, endpoint_findings
from .checkhooks import check_hook_directory
from .clipath import PATH
from .config import ConfigError, ProxyConfig, check_file, key_line, parse_host_port
from .hookpath.hookfile import HookServerConfig
from .host import unixsocket
from .socketclash import distinct_sockets
from .tcplisten import check_listen

__all__ = ["Finding", "Report", "Severity", "check", "check_config_command"]


@dataclass(frozen=True)
class Report:
    config_file: Path | None
    config: ProxyConfig | None  # None when the config file is refused
    hook_dir: Path | None  # None: not checked (the config naming it was refused)
    servers: tuple[HookServerConfig, ...]  # the hook files serve would load
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)

    def lines(self) -> Iterator[str]:
        """The report as an operator reads it: findings first, then what is valid."""
        yield from (str(f) for f in self.findings)
        if self.config is not None:
            c = self.config
            yield (
                f"config {self.config_file or '(defaults)'}: read: listen={c.listen} backend={c.backend} "
                f"image-backend={c.image_backend or c.backend} hook-dir={self.hook_dir}"
            )
        if self.hook_dir is None:
            yield "hook directory: not checked (the config naming it was refused; give --hook-dir)"
        else:
            for server in self.servers:
                yield f"hook {self.hook_dir / server.name}: valid, {server.describe()}"
        errors = sum(f.severity is Severity.ERROR for f in self.findings)
        warnings = len(self.findings) - errors
        yield f"{errors} error(s), {warnings} warning(s)"


def check(config_file: Path | None, hook_dir: Path | None = None) -> Report:
    """Check ``config_file`` (None: the defaults) and the hook directory
    (None: the config's ``hook_dir``), as ``serve --config FILE [--hook-dir DIR]``
    would read them; every error found: each setting refused, and what the
    others name checked as well."""
    findings: list[Finding] = []
    settings, refused = ProxyConfig(), frozenset[str]()  # refused: settings at their default, not checked further
    config: ProxyConfig | None = settings
    if config_file is not None:
        checked = check_file(config_file)
        settings, refused = checked.settings, checked.refused
        config = settings if not checked.errors else None  # serve would refuse the file
        findings += [Finding(Severity.ERROR, config_file, str(exc), exc.line) for exc in checked.errors]
        findings += [Finding(Severity.WARNING, config_file, w.message, w.line) for w in checked.warnings]
    findings += _grace_period(settings, config_file)  # a refused setting is at its default: not checked again
    findings += _distinct_sockets(settings, config_file, refused)
    findings += _backend_sockets(settings, refused)
    findings += _metrics_listen(settings, config_file)
    findings += _event_loop(settings, config_file)
    directory = hook_dir or (settings.hook_dir if "hook_dir" not in refused else None)
    servers: tuple[HookServerConfig, ...] = ()
    if directory is not None:
        servers, hook_findings = check_hook_directory(directory)
        findings += hook_findings
    return Report(config_file, config, directory, servers, tuple(findings))


def _backend_sockets(config: ProxyConfig, refused: frozenset[str]) -> list[Finding]:
    sockets = {"backend": config.backend, "image-backend": config.image_backend}
    findings = [
        f for name, path in sockets.items()
        if path is not None and name.replace("-", "_") not in refused for f in endpoint_findings(path, name)
    ]
    if "listen" in refused:
        return findings
    # serve's own rules for the socket it binds (host.unixsocket.prepare), checked without changing anything.
    try:
        unixsocket.check_bindable(config.listen)
    except unixsocket.UnixSocketError as exc:
        findings.append(Finding(Severity.ERROR, config.listen, f"listen: {exc}"))
    return findings


UNIT_TIMEOUT_STOP_S = 20.0  # TimeoutStopSec of systemd/runtime-proxy.service


def _grace_period(config: ProxyConfig, config_file: Path | None) -> list[Finding]:
    """A stop outlasting the unit's TimeoutStopSec is killed: its records and
    post hooks cut short, its socket and lock left behind."""
    from .cripath.server import STOP_PAST_GRACE_S

    allowed = UNIT_TIMEOUT_STOP_S - STOP_PAST_GRACE_S
    if config_file is None or config.grace_period <= allowed:
        return []
    reason = (
        f"grace-period {config.grace_period:g}: a stop takes the grace period plus {STOP_PAST_GRACE_S:g} s; "
        f"the shipped unit's TimeoutStopSec={UNIT_TIMEOUT_STOP_S:g} allows at most {allowed:g} s: raise "
        f"TimeoutStopSec in a drop-in (to {config.grace_period + STOP_PAST_GRACE_S:g} at least)"
    )
    return [Finding(Severity.WARNING, config_file, reason, key_line(config_file, "grace_period"))]


def _distinct_sockets(config: ProxyConfig, config_file: Path | None, refused: frozenset[str]) -> list[Finding]:
    if refused & {"listen", "backend", "image_backend"}:  # one at its default: a clash would be no one's
        return []
    try:
        distinct_sockets(config, config_file)
    except ConfigError as exc:
        return [Finding(Severity.ERROR, config_file or config.listen, str(exc), exc.line)]
    return []


def _metrics_listen(config: ProxyConfig, config_file: Path | None) -> list[Finding]:
    """Its host looked up and its address tried on port 0, as serve's bind
    would find them (tcplisten.py); its port is not tried."""
    if not config.metrics_listen or config_file is None:  # only a file sets it here
        return []
    problem = check_listen(*parse_host_port(config.metrics_listen))  # the form load checked
    if problem is None:
        return []
    severity = Severity.ERROR if problem.certain else Severity.WARNING
    reason = f"metrics-listen {config.metrics_listen!r}: {problem.reason}"
    return [Finding(severity, config_file, reason, key_line(config_file, "metrics_listen"))]


def _event_loop(config: ProxyConfig, config_file: Path | None) -> list[Finding]:
    """`uvloop` where it does not import: serve refuses to start (auto falls back to asyncio)."""
    if config_file is None or config.event_loop != "uvloop" or eventloop.uvloop_available():
        return []
    reason = eventloop.UVLOOP_REFUSED
    return [Finding(Severity.ERROR, config_file, reason, key_line(config_file, "event_loop"))]


@click.command("check-config")
@click.option("--config", "config_file", type=PATH, help="YAML config file, as for serve.")
@click.option(
    "--hook-dir", type=PATH, help="Hook directory to check. [default: the config's hook-dir]"
)
def check_config_command(config_file: Path | None, hook_dir: Path | None) -> None:
    """Check a config file and a hook directory with serve's rules.

    Prints each bad file with the reason; exits 1 if serve would refuse
    anything, 0 otherwise (warnings included)."""
    # The registry logs every rejection; the report below already names them.
    logging.disable(logging.CRITICAL)
    try:
        report = check(config_file, hook_dir)
    finally:
        logging.disable(logging.NOTSET)
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.ok else 1)
