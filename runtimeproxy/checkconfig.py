"""``runtime-proxy check-config``: the settings and the hook directory, checked
by the very code ``serve`` runs (:func:`.config.load`, the hook registry's
reload with its directory and permission rules, :func:`.hookfile.parse_hook_file`).

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

import enum
import json
import logging
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from .clipath import PATH
from .config import ConfigError, ProxyConfig, distinct_sockets, key_line, load_checked, parse_host_port
from .hookpath.executor import HOOKED_METHODS
from .hookpath.hookfile import KNOWN_KEYS, HookServerConfig
from .hookpath.hookkeys import match_keys
from .hookpath.points import HOOK_POINTS, HookType
from .hookpath.registry import HookRegistry
from .host import unixsocket
from .tcplisten import check_listen

__all__ = ["Finding", "Report", "Severity", "check", "check_config_command"]


class Severity(enum.Enum):
    ERROR = "error"  # serve would refuse it, or it cannot work
    WARNING = "warning"  # valid, but probably not what was meant

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Finding:
    severity: Severity
    subject: Path  # the file (or socket, or directory) at fault
    reason: str
    line: int | None = None  # 1-based, when the reason has a place in the file

    def __str__(self) -> str:
        where = f"{self.subject}:{self.line}" if self.line is not None else str(self.subject)
        return f"{self.severity}: {where}: {self.reason}"


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
    would read them."""
    findings: list[Finding] = []
    try:
        config: ProxyConfig | None
        config, warnings = load_checked(config_file)
        findings += [Finding(Severity.WARNING, config_file or Path("."), w.message, w.line) for w in warnings]
    except ConfigError as exc:
        config = None
        findings.append(Finding(Severity.ERROR, config_file or Path("."), str(exc), exc.line))
    if config is not None:
        findings += _grace_period(config, config_file)
        findings += _distinct_sockets(config, config_file)
        findings += _backend_sockets(config)
        findings += _metrics_listen(config, config_file)
    directory = hook_dir or (config.hook_dir if config is not None else None)
    servers: tuple[HookServerConfig, ...] = ()
    if directory is not None:
        servers, hook_findings = _hook_directory(directory)
        findings += hook_findings
    return Report(config_file, config, directory, servers, tuple(findings))


def _backend_sockets(config: ProxyConfig) -> list[Finding]:
    sockets = {"backend": config.backend, "image-backend": config.image_backend}
    findings = [f for name, path in sockets.items() if path is not None for f in _endpoint(path, name)]
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


def _distinct_sockets(config: ProxyConfig, config_file: Path | None) -> list[Finding]:
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


def _endpoint(path: Path, what: str) -> list[Finding]:
    """A socket the proxy connects to: missing is a warning (its server may start
    later), anything but a socket an error (no server can ever listen there)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return [Finding(Severity.WARNING, path, f"{what}: socket does not exist (yet?); calls fail until it does")]
    except OSError as exc:
        return [Finding(Severity.WARNING, path, f"{what}: cannot stat: {exc.strerror or exc}")]
    if not stat.S_ISSOCK(mode):
        return [Finding(Severity.ERROR, path, f"{what}: exists and is not a unix socket")]
    failure = unixsocket.connect_failure(path)
    if failure is None:
        return []
    if failure.nobody_listens:
        return [Finding(Severity.WARNING, path, f"{what}: nobody listens on this socket (left behind by a "
                        "server that was killed or stopped?); calls fail until its server is started again")]
    # EACCES: check-config's user may not connect, the proxy's (root) may; EAGAIN: a server not accepting
    return [Finding(Severity.WARNING, path, f"{what}: cannot connect: {failure.hint}")]


def _hook_directory(directory: Path) -> tuple[tuple[HookServerConfig, ...], list[Finding]]:
    # The registry serve runs, reloaded once: its directory rules, file
    # selection and per-file checks (permissions included) are the ones applied.
    result = HookRegistry(directory).reload()
    findings: list[Finding] = []
    if result.directory_error is not None:
        # A missing directory is normal before the first hook server registers.
        severity = Severity.WARNING if not directory.exists() else Severity.ERROR
        findings.append(Finding(severity, directory, result.directory_error))
    for name, reason in sorted(result.rejected.items()):
        findings.append(Finding(Severity.ERROR, directory / name, reason))
    servers = tuple(result.snapshot.servers.values())
    for server in servers:
        findings += _suspicious(directory / server.name, server)
    findings += _balloons_order(directory, servers)
    return servers, findings


BALLOONS_FILE = "balloons.json"  # what ``hook run balloons`` writes
SIZING_HOOKS = (HookType.PRE_CREATE_CONTAINER, HookType.PRE_UPDATE_CONTAINER_RESOURCES)


def _balloons_order(directory: Path, servers: Iterable[HookServerConfig]) -> Iterable[Finding]:
    """balloons sizes a container by the cpu_shares it is shown: a server called
    after it at the same hook point may set others (batchresource, koordlet for
    BE pods), which the container's later updates show it (docs/hook-balloons.md)."""
    by_name = {s.name: s for s in servers}
    balloons = by_name.get(BALLOONS_FILE)
    if balloons is None:
        return
    later = sorted(
        s.name for s in by_name.values()
        if s.sort_key > balloons.sort_key and any(h in s.hooks and h in balloons.hooks for h in SIZING_HOOKS)
    )
    if later:
        yield Finding(
            Severity.WARNING, directory / BALLOONS_FILE,
            f"called before {', '.join(later)}, which may set cpu_shares balloons would not see: balloons are sized by the "
            f"shares shown, so one may grow at a container's first update; give it a higher priority",
        )


def _suspicious(path: Path, server: HookServerConfig) -> Iterable[Finding]:
    for name in sorted(server.uncalled_hooks):
        yield Finding(Severity.WARNING, path, f"hook point {name} is never called (nor by koord-runtime-proxy); ignored")
    if not server.hooks:
        yield Finding(Severity.WARNING, path, "registers no runtime hooks; it will never be called")
    for hook in sorted(server.hooks, key=lambda h: h.value):
        if not _proxy_calls(hook):
            yield Finding(Severity.WARNING, path, f"hook point {hook.value} is never called by this proxy")
    for finding in _endpoint(Path(server.endpoint), "remote-endpoint"):
        yield Finding(finding.severity, path, f"{finding.reason} ({server.endpoint})")
    for note in server.key_notes:
        yield Finding(Severity.WARNING, path, str(note))
    unknown = sorted(_keys(path) - KNOWN_KEYS)
    if unknown:
        yield Finding(Severity.WARNING, path, f"keys ignored (not read by the proxy): {', '.join(unknown)}")


def _proxy_calls(hook: HookType) -> bool:
    """Whether the hook stage triggers ``hook`` on some CRI method."""
    point = HOOK_POINTS[hook]
    method = HOOKED_METHODS.get(point.cri_method)
    return method is not None and hook in (method.pre, method.post)


def _keys(path: Path) -> set[str]:
    """The top-level keys of a hook file the registry accepted (so it is a JSON
    object), a known one in another case as the known one (as serve reads it)."""
    try:
        doc = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (OSError, ValueError):  # changed since the registry read it: nothing to add
        return set()
    return set(match_keys(doc, KNOWN_KEYS).values) if isinstance(doc, dict) else set()


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
