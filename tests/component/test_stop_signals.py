"""stop_on_signals, which every serving command shares (`serve`, `nri`, `hook run`):
SIGTERM, SIGINT and SIGHUP each end in the orderly stop, logged with the signal
in one line (the commands log none of their own)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

# Installs the handlers, sends itself the signal, and tells what it saw.
SIGNALLED = """\
import asyncio, json, os, signal, sys
from runtimeproxy import logs
from runtimeproxy.stopsignal import stop_on_signals

async def main():
    stop = stop_on_signals()
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    await asyncio.wait_for(stop.wait(), 10)
    print(json.dumps({"received": stop.received}), flush=True)

logs.setup("json")
asyncio.run(main())
"""


@pytest.mark.parametrize(("name", "reason"), [("SIGTERM", "terminated"), ("SIGINT", "interrupt"),
                                              ("SIGHUP", "hangup")])
async def test_each_stop_signal_sets_the_event_and_is_logged(name: str, reason: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SIGNALLED, name, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 20)
    # Without a handler the signal's default action ends it: -signum, nothing printed.
    assert process.returncode == 0, (process.returncode, err.decode())
    assert json.loads(out) == {"received": name}
    (logged,) = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert (logged["msg"], logged["signal"], logged["reason"]) == ("signal received, shutting down", name, reason)
