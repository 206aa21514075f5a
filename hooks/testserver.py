"""A scriptable hook server process for tests.

    python -m hooks.testserver --socket PATH --config JSON_STRING_OR_FILE [--record PATH]
                               [--grace SECONDS] [--socket-mode OCTAL] [--transport frames|grpc]
                               [--log-level LEVEL]

``--config`` is a JSON object (inline if it starts with ``{``, else a file
path) mapping a hook name -- the Koordinator name ("PreCreateContainer") or
the RPC name ("PreCreateContainerHook") -- to what to answer::

    {
      "PreRunPodSandbox": {
        "labels": {"hooked": "yes"}, "annotations": {"a": "b"},
        "cgroup_parent": "/kubepods/besteffort/pod123",
        "resources": {"cpu_shares": 2, "memory_limit_in_bytes": 1073741824}
      },
      "PreCreateContainer": {
        "container_resources": {"cpu_period": 100000, "cpu_quota": 50000, "cpu_shares": 512,
                                "memory_limit_in_bytes": 268435456, "cpuset_cpus": "0-1"},
        "container_annotations": {"hooked": "yes"},
        "container_envs": {"HOOKED": "1"},
        "delay": 0.1
      },
      "PreStartContainer": {"behaviour": "error", "message": "no way", "code": "INTERNAL"},
      "PostStartContainer": "hang",
      "PostStopContainer": {"behaviour": "crash"}
    }

Per hook: ``behaviour`` (or ``behavior``) is ``ok`` (default) | ``error`` |
``hang`` | ``crash``; ``message``/``code`` (a grpc.StatusCode name, default
INTERNAL) are used by ``error``; ``delay`` (seconds) is waited before ``ok``
or ``error``.  Every other key is a field of the hook's response message
(``PodSandboxHookResponse`` for the pod hooks, ``ContainerResourceHookResponse``
otherwise) in proto JSON form, proto field names (e.g. ``cpu_shares``) or JSON
names.  A string entry is a shorthand for ``{"behaviour": <string>}``.  Hooks
not in the config answer an empty response ("no change").

* ``error``: the call is aborted with ``code`` and ``message``;
* ``hang``: the call is never answered (the client's deadline expires);
* ``crash``: the process dies with ``os._exit(1)`` after receiving (and
  recording) the request.

``--record PATH`` appends one JSON line per received request, before the
behaviour is applied: ``{"hook": "PreCreateContainer", "rpc":
"PreCreateContainerHook", "time": <unix time>, "request": {...}}`` where
``request`` is ``json_format.MessageToDict(request,
preserving_proto_field_name=True)`` (so int64 fields are strings, and fields
with default values are omitted).

"ready" is printed (and flushed) on stdout once the socket is listening.
SIGTERM/SIGINT/SIGHUP stop the server (in-flight calls get ``--grace`` seconds) and
exit 0.  Config errors exit 2, start failures exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from hooks.sdk import TRANSPORTS, HookAbort, HookServer, HookServerError
from hooks.sdk import run as sdk_run
from runtimeproxy import eventloop
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

__all__ = ["BEHAVIOURS", "ConfigError", "HookScript", "Recorder", "ScriptedHookServer", "load_config", "main", "parse_config"]

logger = logging.getLogger("hooks.testserver")

BEHAVIOURS = ("ok", "error", "hang", "crash")
_CONTROL_KEYS = frozenset({"behaviour", "behavior", "message", "code", "delay"})


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class HookScript:
    """What the test server does for one hook."""

    behaviour: str = "ok"
    response: Message | None = None
    message: str = ""
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    delay: float = 0.0


def _hook_from_key(key: str) -> HookType:
    for hook, point in HOOK_POINTS.items():
        if key in (hook.value, point.rpc_name):
            return hook
    allowed = ", ".join(h.value for h in HookType)
    raise ConfigError(f"unknown hook {key!r} (allowed: {allowed}, or the same with a 'Hook' suffix)")


def _parse_entry(hook: HookType, entry: object) -> HookScript:
    if isinstance(entry, str):
        entry = {"behaviour": entry}
    if not isinstance(entry, dict):
        raise ConfigError(f"{hook.value}: entry must be an object or a behaviour string, got {type(entry).__name__}")
    behaviour = entry.get("behaviour", entry.get("behavior", "ok"))
    if behaviour not in BEHAVIOURS:
        raise ConfigError(f"{hook.value}: unknown behaviour {behaviour!r} (allowed: {', '.join(BEHAVIOURS)})")
    message = entry.get("message", f"{hook.value} hook failed (scripted error)")
    if not isinstance(message, str):
        raise ConfigError(f"{hook.value}: message must be a string")
    code_name = entry.get("code", "INTERNAL")
    try:
        code = grpc.StatusCode[code_name] if isinstance(code_name, str) else None
    except KeyError:
        code = None
    if code is None or code is grpc.StatusCode.OK:
        raise ConfigError(f"{hook.value}: code must be a non-OK grpc.StatusCode name, got {code_name!r}")
    delay = entry.get("delay", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ConfigError(f"{hook.value}: delay must be a number of seconds >= 0, got {delay!r}")

    fields = {k: v for k, v in entry.items() if k not in _CONTROL_KEYS}
    response_type = HOOK_POINTS[hook].response_type
    response = None
    if fields:
        try:
            response = json_format.ParseDict(fields, response_type())
        except json_format.ParseError as exc:
            raise ConfigError(f"{hook.value}: bad {response_type.__name__} fields: {exc}") from None
    return HookScript(behaviour=behaviour, response=response, message=message, code=code, delay=float(delay))


def parse_config(doc: object) -> dict[HookType, HookScript]:
    """Validate a decoded config document."""
    if not isinstance(doc, dict):
        raise ConfigError(f"config must be a JSON object mapping hook names to entries, got {type(doc).__name__}")
    scripts: dict[HookType, HookScript] = {}
    for key, entry in doc.items():
        hook = _hook_from_key(key)
        if hook in scripts:
            raise ConfigError(f"hook {hook.value} configured twice")
        scripts[hook] = _parse_entry(hook, entry)
    return scripts


def load_config(value: str) -> dict[HookType, HookScript]:
    """``value`` is inline JSON (starting with ``{`` or ``[``) or the path of a JSON file."""
    if value.lstrip().startswith(("{", "[")):
        text, origin = value, "--config"
    else:
        try:
            text, origin = Path(value).read_text(), value
        except OSError as exc:
            raise ConfigError(f"cannot read config file {value}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{origin}: invalid JSON: {exc}") from None
    return parse_config(doc)


class Recorder:
    """Appends one JSON line per received request, flushed immediately."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self._file: TextIO | None = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115

    def record(self, hook: HookType, request: Message) -> None:
        if self._file is None:
            return
        line = json.dumps(
            {
                "hook": hook.value,
                "rpc": HOOK_POINTS[hook].rpc_name,
                "time": time.time(),
                "request": json_format.MessageToDict(request, preserving_proto_field_name=True),
            },
            sort_keys=True,
        )
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class ScriptedHookServer(HookServer):
    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        scripts: Mapping[HookType, HookScript],
        recorder: Recorder,
        **kwargs: object,
    ) -> None:
        super().__init__(socket_path, **kwargs)  # type: ignore[arg-type]  # kwargs: HookServer's own, passed on as given
        self._scripts = dict(scripts)
        self._recorder = recorder

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        self._recorder.record(hook, request)
        script = self._scripts.get(hook)
        if script is None:
            return None
        if script.behaviour == "crash":
            logger.warning("%s: crashing as scripted", hook.value)
            sys.stderr.flush()
            os._exit(1)
        if script.behaviour == "hang":
            await asyncio.Event().wait()  # never set; cancelled when the server stops
        if script.delay:
            await asyncio.sleep(script.delay)
        if script.behaviour == "error":
            raise HookAbort(script.code, script.message)
        if script.response is None:
            return None
        response = HOOK_POINTS[hook].response_type()
        response.CopyFrom(script.response)
        return response


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hooks.testserver", description="Scriptable hook server for tests.")
    parser.add_argument("--socket", required=True, help="unix socket path to listen on")
    parser.add_argument("--config", default="{}", help="JSON object, inline (starting with '{') or a file path")
    parser.add_argument("--record", default=None, help="append one JSON line per received request to this file")
    parser.add_argument("--grace", type=float, default=0.5, help="seconds in-flight calls get on SIGTERM")
    parser.add_argument("--socket-mode", type=lambda v: int(v, 8), default=0o660, help="socket file mode (octal)")
    parser.add_argument("--transport", choices=TRANSPORTS, default="frames",
                        help="frames: the SDK's own HTTP/2 transport (default); grpc: grpc.aio")
    parser.add_argument("--event-loop", choices=eventloop.EVENT_LOOPS, default="auto",
                        help="auto: uvloop when installed (as the SDK's run), else asyncio's own")
    parser.add_argument("--log-level", default="WARNING")
    return parser.parse_args(argv)


async def _serve(server: ScriptedHookServer, grace: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except HookServerError as exc:
        print(f"testserver: {exc}", file=sys.stderr, flush=True)
        return 1
    print("ready", flush=True)
    await stop.wait()
    await server.stop(grace)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        scripts = load_config(args.config)
    except ConfigError as exc:
        print(f"testserver: config error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        recorder = Recorder(args.record)
    except OSError as exc:
        print(f"testserver: cannot open record file {args.record}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 2
    try:
        try:
            server = ScriptedHookServer(
                args.socket, scripts, recorder, socket_mode=args.socket_mode, grace=args.grace,
                transport=args.transport,
            )
        except ValueError as exc:  # e.g. socket path too long
            print(f"testserver: {exc}", file=sys.stderr, flush=True)
            return 2
        try:
            loop = eventloop.resolve(args.event_loop)
        except eventloop.EventLoopError as exc:
            print(f"testserver: {exc}", file=sys.stderr, flush=True)
            return 2
        return sdk_run(_serve(server, args.grace), loop)
    finally:
        recorder.close()


if __name__ == "__main__":
    sys.exit(main())
