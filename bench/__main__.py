"""``python -m bench``: run the benchmark, print the table, optionally write JSON.

``python -m bench soak [...]`` runs the soak instead (see bench/soak.py);
``python -m bench fuzz [...]`` the long fuzz run (see bench/fuzz.py);
``python -m bench headers [...]`` what reading a request's header block
costs (see bench/headers.py); ``python -m bench callgrind [...]`` the
proxy's instructions per pod lifecycle (see bench/callgrind.py);
``python -m bench cgdiff A B`` two callgrind dumps compared by function."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from runtimeproxy.eventloop import EVENT_LOOPS

from .procs import BenchError
from .report import render, write_json
from .runner import Options, quick_options, run


def _parse(argv: list[str] | None) -> Options:
    d = Options()
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--rounds", type=int, default=d.rounds,
                   help=f"interleaved rounds of unary calls per case and target [{d.rounds}]")
    p.add_argument("--duration", type=float, default=d.duration,
                   help=f"seconds per unary round and target [{d.duration}]")
    p.add_argument("--lifecycles", type=int, default=d.lifecycles,
                   help=f"recorded pod lifecycles per mode [{d.lifecycles}]")
    p.add_argument("--containers", type=int, default=d.containers,
                   help=f"containers present during ListContainers [{d.containers}]")
    p.add_argument("--concurrency", type=lambda s: tuple(int(x) for x in s.split(",")),
                   default=d.concurrencies, help="comma-separated unary concurrencies [1,16]")
    p.add_argument("--quick", action="store_true", help="smoke mode: 1 short round, 3 lifecycles per mode (< 60 s); overrides --rounds, --duration, --lifecycles")
    p.add_argument("--json", type=Path, help="also write all figures as JSON to this file")
    p.add_argument("--data-path", choices=("frames", "grpc"), default=d.data_path,
                   help="the proxies' --data-path [not passed: their default]")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default=d.event_loop,
                   help="the proxies' --event-loop [not passed: the proxies' default]")
    p.add_argument("--proxy-nice", type=int, default=d.proxy_nice,
                   help="the proxies' and reference relays' niceness [the Nice= of systemd/runtime-proxy.service]")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs of every process)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.duration <= 0 or a.lifecycles < 1 or a.containers < 0:
        p.error("--rounds and --lifecycles must be >= 1, --duration > 0, --containers >= 0")
    opts = Options(rounds=a.rounds, duration=a.duration, lifecycles=a.lifecycles, containers=a.containers,
                   concurrencies=a.concurrency, json_path=a.json, keep=a.keep, data_path=a.data_path,
                   event_loop=a.event_loop, proxy_nice=a.proxy_nice)
    return quick_options(opts) if a.quick else opts


async def _main(opts: Options) -> dict:
    # SIGTERM behaves like Ctrl-C: cancel the run, which then cleans up.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run(opts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["headers"]:  # in-process, no runtime: needs no root
        from .headers import main as headers_main

        return headers_main(args[1:])
    if args[:1] == ["callgrind"]:  # a fake runtime, no containerd: needs no root
        from .callgrind import main as callgrind_main

        return callgrind_main(args[1:])
    if args[:1] == ["cgdiff"]:  # two callgrind dumps compared
        from .cgdiff import main as cgdiff_main

        return cgdiff_main(args[1:])
    if os.geteuid() != 0:
        print("bench: needs root (it runs containerd and runc)", file=sys.stderr)
        return 2
    if args[:1] == ["node"]:  # the kubelet-at-rest report (bench/node.py)
        from .node import main as node_main

        return node_main(args[1:])
    if args[:1] in (["soak"], ["fuzz"]):
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        return _subcommand(args[0], args[1:])
    opts = _parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        results = asyncio.run(_main(opts))
    except KeyboardInterrupt:
        print("bench: interrupted; everything was stopped", file=sys.stderr)
        return 130
    except asyncio.CancelledError:
        print("bench: terminated; everything was stopped", file=sys.stderr)
        return 143
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    print(render(results))
    if opts.json_path is not None:
        write_json(results, opts.json_path)
        print(f"JSON written to {opts.json_path}")
    return 0


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "soak":
        from . import soak
        return soak.main(argv)
    from . import fuzz
    return fuzz.main(argv)


if __name__ == "__main__":
    sys.exit(main())
