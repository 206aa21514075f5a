"""bench/soak.py: the verdict on a soak run (the run itself needs containerd: `python -m bench soak --quick`)."""

from __future__ import annotations

from collections import Counter

from bench.soak import Phase, Sample, _method_of, render, verdict


def phase(errors: dict | None = None, rss: tuple[float, ...] = (), fds: tuple[int, ...] = ()) -> Phase:
    samples = [Sample(calls=(i + 1) * 10, rss_mib=r, fds=f) for i, (r, f) in enumerate(zip(rss, fds, strict=True))]
    return Phase(calls=100, errors=Counter(errors or {}), samples=samples, seconds=1.0)


STEADY = {"rss": (50.0, 52.0, 53.0, 57.1), "fds": (19, 19, 18, 19)}


def test_a_steady_proxy_passes() -> None:
    assert verdict(phase(), phase(**STEADY), alive=True) == []


def test_errors_direct_calls_also_got_are_not_held_against_the_proxy() -> None:
    both = {("ExecSync", "DEADLINE_EXCEEDED"): 1}
    assert verdict(phase(both), phase(both, **STEADY), alive=True) == []


def test_each_problem_is_named() -> None:
    problems = verdict(phase(), phase({("Version", "INTERNAL"): 2}, rss=(50.0, 52.0, 60.0, 57.2), fds=(19, 19, 19, 20)),
                       alive=False)
    assert problems[0] == "the proxy died during the run"
    assert "('Version', 'INTERNAL'): 2" in problems[1]
    assert problems[2] == "proxy RSS grew 10.0% between 20 and 40 calls"
    assert problems[3] == "proxy file descriptors grew from 19 to 20"
    assert verdict(phase(), phase(rss=(50.0,), fds=(19,)), alive=True) == ["too few samples of the proxy"]


def test_render_shows_the_figures() -> None:
    text = render({"direct": phase(), "proxy": phase(**STEADY), "problems": []})
    assert "RSS growth from the 20% mark to the end: +9.8%" in text and "fds 19 -> 19" in text
    assert text.endswith("verdict: ok")


def test_error_tickets_name_their_method() -> None:
    assert [_method_of(t) for t in range(10)] == ["Version"] * 3 + ["ListPodSandbox"] * 2 + ["ListContainers"] * 2 + [
        "ContainerStatus"] * 2 + ["PodSandboxStatus"]
    assert _method_of(99) == "ExecSync"
