"""`python -m bench` options that reach the proxies' command lines."""

from __future__ import annotations

from pathlib import Path

from bench.__main__ import _parse
from bench.procs import ProxyChild


def test_quick_mode_keeps_the_data_path() -> None:
    # --quick used to rebuild the options from scratch and drop --data-path:
    # a quick run of `--data-path frames` measured the grpc path.
    opts = _parse(["--quick", "--data-path", "frames"])
    assert opts.quick
    assert opts.data_path == "frames"


def test_quick_mode_keeps_the_event_loop() -> None:
    assert _parse(["--quick", "--event-loop", "asyncio"]).event_loop == "asyncio"


def test_the_event_loop_reaches_the_proxies_only_when_asked_for() -> None:
    def argv(**kwargs: object) -> list[str]:
        return ProxyChild("proxy", Path("/p.sock"), Path("/b.sock"), Path("/h.d"), Path("/p.log"), **kwargs).argv

    # Not asked for: no flag, as for a checkout that predates it.
    assert _parse([]).event_loop is None
    assert "--event-loop" not in argv()
    assert _parse([]).data_path is None
    assert "--data-path" not in argv()
    assert argv(data_path="grpc")[-2:] == ["--data-path", "grpc"]
    assert argv(event_loop="uvloop")[-2:] == ["--event-loop", "uvloop"]
    assert argv(data_path="frames", event_loop="asyncio")[-4:] == ["--data-path", "frames", "--event-loop", "asyncio"]


def test_the_proxies_run_at_the_niceness_their_unit_gives_them(tmp_path: Path) -> None:
    from bench.procs import RelayChild, unit_nice

    assert unit_nice() == -10  # systemd/runtime-proxy.service
    bare = tmp_path / "bare.service"
    bare.write_text("[Service]\nExecStart=/bin/true\n")
    assert unit_nice(bare) == 0
    assert _parse([]).proxy_nice is None  # the run uses unit_nice()
    assert _parse(["--proxy-nice", "0"]).proxy_nice == 0
    proxy = ProxyChild("proxy", Path("/p.sock"), Path("/b.sock"), Path("/h.d"), Path("/p.log"), nice=-10)
    assert proxy.argv[:3] == ["nice", "-n", "-10"] and "serve" in proxy.argv
    assert ProxyChild("proxy", Path("/p.sock"), Path("/b.sock"), Path("/h.d"), Path("/p.log")).argv[0] != "nice"
    assert RelayChild("bytes", Path("/r.sock"), Path("/b.sock"), Path("/r.log"), nice=-10).argv[:3] == ["nice", "-n", "-10"]
