"""`bench/report.py` on hand-made results: issue 14's verdicts and the printed report (no process started)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from bench.lifecycle import STEPS
from bench.report import GRPC_PATH, render, unjudged, verdicts, write_json
from bench.runner import _ratios

README = Path(__file__).resolve().parents[2] / "bench" / "README.md"


def _target(calls_per_s: float, p50: float, rounds: list[float]) -> dict[str, Any]:
    return {"calls": int(calls_per_s), "errors": 0, "error_samples": [], "calls_per_s": calls_per_s,
            "p50_ms": p50, "p99_ms": p50 * 3, "mean_ms": p50, "calls_per_s_by_round": rounds}


def _case(method: str, conc: int, *, p50: float, throughput: float, cpu: float) -> dict[str, Any]:
    """One unary entry as the runner writes it: direct, proxy and the byte relay, with their ratios."""
    direct = _target(1000.0, 0.2, [1000.0])
    proxy = _target(1000.0 * throughput, 0.2 * p50, [1000.0 * throughput])
    proxy["proxy_cpu_ms_per_call"] = cpu
    relay = _target(950.0, 0.204, [950.0])
    relay.update(relay_cpu_ms_per_call=0.05, runtime_cpu_ms_per_call=0.31, client_cpu_ms_per_call=0.17,
                 idle_percent=14.6)
    return {"method": method, "concurrency": conc, "direct": direct, "proxy": proxy, "byte-relay": relay,
            "ratios": _ratios(direct, proxy), "ratios_byte_relay": _ratios(direct, relay)}


def _mode(median_ms: float) -> dict[str, Any]:
    return {"n": 3, "failures": 0, "failure_samples": [], "median_ms": median_ms, "p90_ms": median_ms,
            "mean_ms": median_ms, "min_ms": median_ms, "max_ms": median_ms,
            "step_median_ms": {step: median_ms / len(STEPS) for step in STEPS},
            "median_ratio": median_ms / 100.0, "p90_ratio": median_ms / 100.0,
            "paired_median_ratio": median_ms / 100.0}


def _results(**over: Any) -> dict[str, Any]:
    """A run where every target passes, unless `over` says otherwise."""
    figures = {"version_p50": 1.4, "version_tput": 0.7, "list_p50": 1.2, "plain": 101.0, "hooked": 104.0,
               "lean": 102.5, "rtt": 0.8, "cpu_c1": 0.3, "rss": 55.7, "concurrencies": (1, 16)} | over
    unary = [_case(m, c, p50=figures["version_p50"] if m == "Version" else figures["list_p50"],
                   throughput=figures["version_tput"] if m == "Version" else 0.8,
                   cpu=figures["cpu_c1"] if (m, c) == ("Version", 1) else 0.125)
             for m in ("Version", "ListContainers") for c in figures["concurrencies"]]
    return {
        "options": {"rounds": 1, "duration": 0.8, "lifecycles": 3, "containers": 100, "pods": 2, "quick": True,
                    "data_path": None, "event_loop": None},
        "environment": {"runtime": "containerd", "cpus": 2, "python": "3", "grpcio": "1",
                        "loadavg_at_start": (0.5, 0.5, 0.5)},
        "list_containers_count": {"direct": 100, "proxy": 100},
        "unary": unary,
        "lifecycle": {"modes": {"direct": _mode(100.0), "proxy": _mode(figures["plain"]),
                                "proxy+hook": _mode(figures["hooked"]),
                                "proxy+leanhook": _mode(figures["lean"]), "grpc-relay": _mode(103.0),
                                "byte-relay": _mode(101.0)}},
        "hook_rtt": {"calls": 500, "errors": 0, "request_bytes": 700, "p50_ms": figures["rtt"], "p90_ms": 1.0,
                     "p99_ms": 1.5, "mean_ms": 0.9, "calls_per_s": 1100.0},
        "hook_rtt_lean": {"calls": 900, "errors": 0, "request_bytes": 700, "p50_ms": 0.42, "p90_ms": 0.5,
                          "p99_ms": 0.7, "mean_ms": 0.43, "calls_per_s": 2300.0},
        "memory": {"proxy": {"rss_mib": figures["rss"], "peak_mib": 60.0},
                   "proxy+hook": {"rss_mib": 56.9, "peak_mib": 61.0},
                   "proxy+leanhook": {"rss_mib": 57.1, "peak_mib": 61.2}},
        "problems": [],
        "wall_seconds": 70.0,
    }


ALL_TARGETS = [
    "Version c1 p50 <= 1.50x direct",
    "Version c16 throughput >= 0.60x direct",
    "ListContainers (100) c1 p50 <= 1.30x direct",
    "ListContainers (100) c16 p50 <= 1.30x direct",
    "lifecycle without hooks paired median <= 1.02x direct",
    "hooked lifecycle (SDK hook server) paired median <= 1.05x direct",
    "hooked lifecycle (lean hook server) paired median <= 1.05x direct",
    "hook round trip p50 < 2 ms",
    "proxy CPU per Version call c1 <= 0.37 ms (grpc path 1.11 ms / 3)",
    "proxy RSS at the end <= 59.9 MiB (grpc path)",
]


def _by_target(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["target"]: v for v in verdicts(results)}


def test_every_target_of_issue_14_is_judged() -> None:
    got = verdicts(_results())
    assert [v["target"] for v in got] == ALL_TARGETS
    assert all(v["pass"] is True for v in got)
    shown = {v["target"]: v["shown"] for v in got}
    assert shown["Version c1 p50 <= 1.50x direct"] == "1.40x"
    assert shown["Version c16 throughput >= 0.60x direct"] == "0.70x"
    assert shown["lifecycle without hooks paired median <= 1.02x direct"] == "1.01x"
    assert shown[ALL_TARGETS[8]] == "0.300 ms"
    assert shown[ALL_TARGETS[9]] == "55.7 MiB"


@pytest.mark.parametrize(("over", "target"), [
    ({"version_p50": 1.6}, "Version c1 p50 <= 1.50x direct"),
    ({"version_tput": 0.5}, "Version c16 throughput >= 0.60x direct"),
    ({"plain": 103.0}, "lifecycle without hooks paired median <= 1.02x direct"),
    ({"hooked": 106.0}, "hooked lifecycle (SDK hook server) paired median <= 1.05x direct"),
    ({"lean": 105.5}, "hooked lifecycle (lean hook server) paired median <= 1.05x direct"),
    ({"rtt": 2.0}, "hook round trip p50 < 2 ms"),
    ({"cpu_c1": 0.4}, ALL_TARGETS[8]),
    ({"rss": 60.0}, ALL_TARGETS[9]),
])
def test_a_missed_target_fails_alone(over: dict[str, float], target: str) -> None:
    got = _by_target(_results(**over))
    assert [t for t, v in got.items() if not v["pass"]] == [target]


def test_listcontainers_is_judged_at_every_concurrency() -> None:
    results = _results()
    listing = [e for e in results["unary"] if e["method"] == "ListContainers"]
    listing[1]["ratios"]["p50"] = 1.35  # c16 only
    got = _by_target(results)
    assert got["ListContainers (100) c1 p50 <= 1.30x direct"]["pass"]
    assert not got["ListContainers (100) c16 p50 <= 1.30x direct"]["pass"]
    assert got["ListContainers (100) c16 p50 <= 1.30x direct"]["shown"] == "1.35x"


def test_limits_themselves_pass() -> None:
    results = _results(plain=102.0, hooked=105.0, lean=105.0, cpu_c1=1.11 / 3, rss=59.9)
    for e in results["unary"]:  # the limits exactly, not as a quotient of two latencies
        e["ratios"]["p50"] = 1.5 if e["method"] == "Version" else 1.3
        e["ratios"]["throughput"] = 0.6
    got = _by_target(results)
    assert all(v["pass"] for t, v in got.items()), got


def test_lifecycles_are_judged_on_the_paired_median_with_its_interval_shown() -> None:
    # A drifting machine: the ratio of the two medians says 1.10x, each iteration's pair 1.01x.
    results = _results()
    proxy = results["lifecycle"]["modes"]["proxy"]
    proxy.update(median_ratio=1.10, paired_median_ratio=1.01, paired_interval90=[0.996, 1.024])
    got = _by_target(results)["lifecycle without hooks paired median <= 1.02x direct"]
    assert (got["value"], got["pass"], got["shown"]) == (1.01, True, "1.01x (90% interval 1.00-1.02)")
    proxy.update(median_ratio=1.00, paired_median_ratio=1.03)
    assert _by_target(results)["lifecycle without hooks paired median <= 1.02x direct"]["pass"] is False


def test_a_measured_figure_that_is_nan_fails() -> None:
    results = _results()
    results["unary"][0]["ratios"]["p50"] = math.nan  # e.g. every call through the proxy failed
    results["lifecycle"]["modes"]["proxy"]["paired_median_ratio"] = None  # NaN as the JSON writes it
    got = _by_target(results)
    assert (got["Version c1 p50 <= 1.50x direct"]["shown"], got["Version c1 p50 <= 1.50x direct"]["pass"]) == \
        ("n/a", False)
    assert got["lifecycle without hooks paired median <= 1.02x direct"]["pass"] is False


def test_missing_data_gives_no_verdict_for_its_targets() -> None:
    only_c1 = _by_target(_results(concurrencies=(1,)))
    assert set(only_c1) == set(ALL_TARGETS) - {"Version c16 throughput >= 0.60x direct",
                                               "ListContainers (100) c16 p50 <= 1.30x direct"}
    only_c16 = _by_target(_results(concurrencies=(16,)))
    assert "Version c1 p50 <= 1.50x direct" not in only_c16
    assert ALL_TARGETS[8] not in only_c16  # no Version c1 CPU figure: nothing to compare with the baseline
    assert "Version c16 throughput >= 0.60x direct" in only_c16

    results = _results()
    for key in ("unary", "hook_rtt", "memory"):
        del results[key]
    del results["lifecycle"]["modes"]["proxy"]
    assert [v["target"] for v in verdicts(results)] == ALL_TARGETS[5:7]
    assert verdicts({"options": {}}) == []
    assert unjudged({"options": {}}) == []


def test_figures_without_a_recorded_baseline_are_listed_unjudged() -> None:
    got = {u["figure"]: u["shown"] for u in unjudged(_results())}
    assert got == {"proxy CPU per Version call c16": "0.125 ms",
                   "proxy CPU per ListContainers call c1": "0.125 ms",
                   "proxy CPU per ListContainers call c16": "0.125 ms",
                   "proxy+hook RSS at the end": "56.9 MiB",
                   "proxy+leanhook RSS at the end": "57.1 MiB"}
    assert not any(v["target"].startswith(("proxy CPU per ListContainers", "proxy+hook RSS", "proxy+leanhook RSS"))
                   for v in verdicts(_results()))


def test_the_baseline_is_the_grpc_column_of_the_readme() -> None:
    # The judged CPU and RSS figures must stay the ones bench/README.md records for the grpc data path.
    text = README.read_text()
    cpu = re.search(r"^\| proxy CPU per `Version` call, c1 \| [^|]+ \| ([0-9.]+) ms \|$", text, re.M)
    rss = re.search(r"^\| proxy RSS at the end \| [^|]+ \| ([0-9.]+) MiB \|$", text, re.M)
    assert cpu and rss
    assert GRPC_PATH.cpu("Version", 1) == float(cpu.group(1))
    assert GRPC_PATH.rss("proxy") == float(rss.group(1))


def test_render_prints_the_reference_relay_and_every_target() -> None:
    results = _results(version_p50=1.6, rss=61.0)
    text = render(results)
    lines = text.splitlines()
    assert any(re.fullmatch(r"Version\s+1\s+byte-relay\s+950\s+950\s+0\.204\s+0\.612\s+0"
                            r"\s+0\.050\s+0\.310\s+0\.170\s+15%", ln) for ln in lines)
    # A run that sampled no CPU (figures from an older JSON): its columns say so.
    assert any(re.fullmatch(r"Version\s+1\s+direct(\s+[0-9.]+){4}\s+0\s+n/a\s+n/a\s+n/a", ln) for ln in lines)
    assert sum("byte-relay/direct: p50 1.02x  throughput 0.95x  (reference, not judged)" in ln
               for ln in lines) == 4
    assert "floor of any Python relay" in text
    assert "proxy/direct: p50 1.60x" in text
    for v in verdicts(results):
        row = [ln for ln in lines if ln.strip().startswith(v["target"])]
        assert len(row) == 1 and row[0].split()[-2:] == [v["shown"].split()[-1] if v["shown"].endswith(
            ("ms", "MiB")) else v["shown"], "PASS" if v["pass"] else "FAIL"], row
    assert sum(ln.endswith("FAIL") for ln in lines) == 2
    assert "not judged" in text
    assert any(ln.split()[:6] == ["proxy+hook", "RSS", "at", "the", "end", "56.9"] for ln in lines)


def test_render_of_a_run_without_the_reference_or_targets_data() -> None:
    results = _results()
    for e in results["unary"]:
        del e["byte-relay"], e["ratios_byte_relay"]
    del results["memory"], results["hook_rtt"]
    text = render(results)
    assert "byte-relay/direct" not in text
    assert "Version c1 p50 <= 1.50x direct" in text
    assert "RSS" not in text

    minimal = {"options": {"quick": False, "containers": 0, "pods": 0}, "problems": []}
    assert "Targets:" in render(minimal)


def test_json_carries_the_reference_and_both_lists(tmp_path: Path) -> None:
    results = _results()
    results["unary"][0]["ratios"]["p50"] = math.nan
    write_json(results, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    entry = doc["unary"][0]
    assert entry["byte-relay"]["calls_per_s"] == 950.0
    assert entry["ratios_byte_relay"]["throughput"] == pytest.approx(0.95)
    assert [t["target"] for t in doc["targets"]] == ALL_TARGETS
    assert doc["targets"][0]["value"] is None and doc["targets"][0]["pass"] is False
    assert len(doc["unjudged"]) == 5


def test_the_aa_control_is_shown_beside_the_lifecycle_verdicts_and_never_judged(tmp_path: Path) -> None:
    results = _results()
    assert "A/A control" not in render(results)  # a run without it (an older JSON) shows nothing
    before = verdicts(results)
    results["lifecycle"]["modes"]["direct-again"] = _mode(101.5) | {"paired_interval90": (0.97, 1.04)}
    assert verdicts(results) == before
    lines = render(results).splitlines()
    heading = lines.index("   the lifecycle measure's own spread in this run (an A/A control, not judged):")
    assert lines[heading + 1].split()[-4:] == ["1.01x", "(90%", "interval", "0.97-1.04)"]
    assert lines[heading + 1].split()[0] == "direct-again:"
    assert any(ln.split()[:1] == ["direct-again"] and ln.split()[-1] == "0" for ln in lines)  # its row in the table
    write_json(results, tmp_path / "r.json")
    control = json.loads((tmp_path / "r.json").read_text())["control"]
    assert control["value"] == pytest.approx(1.015)


def test_reference_ratios_are_computed_as_the_proxy_ones() -> None:
    direct = _target(1000.0, 0.2, [900.0, 1100.0])
    other = _target(600.0, 0.3, [450.0, 770.0])
    r = _ratios(direct, other)
    assert r["p50"] == pytest.approx(1.5)
    assert r["p99"] == pytest.approx(1.5)
    assert r["throughput"] == pytest.approx(0.6)
    assert r["throughput_by_round"] == pytest.approx([0.5, 0.7])
    assert (r["throughput_round_min"], r["throughput_round_max"]) == pytest.approx((0.5, 0.7))


def test_render_shows_sparse_calls_when_measured() -> None:
    results = _results()
    assert "sparse" not in render(results)
    results["sparse"] = {"gap_ms": 20.0, "hook": {"calls": 120, "errors": 0, "p50_ms": 1.9, "p90_ms": 2.4},
                         "lean hook": {"calls": 121, "errors": 0, "p50_ms": 0.8, "p90_ms": 0.9},
                         "Version direct": {"calls": 130, "errors": 0, "p50_ms": 1.5, "p90_ms": 1.8},
                         "Version proxy": {"calls": 125, "errors": 0, "p50_ms": 2.1, "p90_ms": 2.6}}
    text = render(results)
    assert "one call every 20 ms" in text
    assert "hook round trip (SDK) p50 1.900 ms" in text
    assert "hook round trip (lean) p50 0.800 ms" in text
    assert "Version direct p50 1.500 ms, through the proxy 2.100 ms (1.40x, +0.600 ms)" in text


def test_render_shows_both_hook_servers_and_what_each_proxy_saw_of_them() -> None:
    results = _results()
    per_hook = {"PreCreateContainer": {"count": 3, "mean_ms": 1.25}}
    for key, mean in (("proxy_metrics", 1.7), ("proxy_metrics_lean", 0.9)):
        results["lifecycle"][key] = {"hook_calls": 18, "hook_mean_ms": mean, "outcomes": {"ok": 18.0},
                                     "per_hook": per_hook, "hooked_calls": {}}
    lines = render(results).splitlines()
    assert any(re.fullmatch(r"\s+SDK:\s+calls 500\s+p50 0\.800 ms.*errors 0", ln) for ln in lines)
    assert any(re.fullmatch(r"\s+lean:\s+calls 900\s+p50 0\.420 ms.*errors 0", ln) for ln in lines)
    assert any(re.fullmatch(r"proxy\+leanhook\s+3(\s+102\.5){5}\s+1\.02x\s+1\.02x\s+1\.02x.*0", ln) for ln in lines)
    seen = [ln for ln in lines if "as seen inside the proxy" in ln]
    assert [ln.split(",")[0].strip() for ln in seen] == ["proxy+hook", "proxy+leanhook"]
    assert "all hooks: 18 calls, mean 1.700 ms" in "\n".join(lines)
    assert "all hooks: 18 calls, mean 0.900 ms" in "\n".join(lines)
    # Per call: direct's time, then what each mode adds (102.5 ms / 7 calls against 100 / 7).
    header = next(ln for ln in lines if ln.split()[:2] == ["call", "direct"])
    assert header.split()[2:] == ["+proxy", "+proxy+hook", "+proxy+leanhook", "+grpc-relay", "+byte-relay"]
    assert any(ln.split() == ["RunPodSandbox", "14.29", "+0.14", "+0.57", "+0.36", "+0.43", "+0.14"] for ln in lines)
