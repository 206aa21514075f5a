"""bench/hookcpu.py: the requests it sends are the proxy's for each hook point, and a dump's count is read."""

from __future__ import annotations

from pathlib import Path

from bench import hookcpu
from bench.cgdriver import read_dump
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType


def test_one_request_per_hook_point_each_of_its_type(tmp_path: Path) -> None:
    built = hookcpu.requests(tmp_path)
    assert set(built) == set(HookType)
    for hook, body in built.items():
        request = HOOK_POINTS[hook].request_type.FromString(body)
        assert request.pod_meta.name.startswith("hookcpu")
        if not hook.is_pod_hook:
            assert request.container_meta.name == "sleeper"
            # Only a created container has no id yet; the later hook points see the stored record's.
            assert request.container_meta.id == ("" if hook is HookType.PRE_CREATE_CONTAINER else hookcpu.CONTAINER_ID)
            assert request.container_resources.cpu_quota == (
                100000 if hook is HookType.PRE_UPDATE_CONTAINER_RESOURCES else 50000)


def test_a_dumps_instruction_count_is_its_summary_line(tmp_path: Path) -> None:
    dump = tmp_path / "cg.out.1"
    dump.write_text("# callgrind format\nevents: Ir\n\nfn=(1) main\n3 100\n\nsummary: 123456\ntotals: 123456\n")
    assert read_dump(dump).instructions == 123456  # how hookcpu reads each dump


def test_the_interleaved_lifecycle_is_the_six_calls_a_bench_lifecycle_makes_in_order() -> None:
    assert hookcpu.LIFECYCLE[0] is HookType.PRE_RUN_POD_SANDBOX and hookcpu.LIFECYCLE[-1] is HookType.POST_STOP_POD_SANDBOX
    assert len(hookcpu.LIFECYCLE) == 6
    assert set(hookcpu.LIFECYCLE) == set(HookType) - {HookType.PRE_UPDATE_CONTAINER_RESOURCES}
