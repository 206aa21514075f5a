import pytest

from hooks.batchresource.resources import (
    CFS_PERIOD,
    UNLIMITED,
    CgroupValues,
    container_values,
    memory_limit,
    pod_totals,
    pod_values,
    quota,
    shares,
)
from hooks.batchresource.spec import (
    ANNOTATION_SPEC,
    MAX_MEMORY_BYTES,
    MAX_MILLI_CPU,
    ContainerBatch,
    parse_spec,
)

from .specs import annotation, container


def spec_of(containers: dict, init: dict | None = None):
    return parse_spec(annotation(containers, init)[ANNOTATION_SPEC])


@pytest.mark.parametrize(
    ("milli", "expected"),
    [(None, 2), (0, 2), (1, 2), (2, 2), (3, 3), (500, 512), (1000, 1024), (1001, 1025), (2500, 2560), (256000, 262144), (256001, 262144), (MAX_MILLI_CPU, 262144)],
)
def test_shares(milli, expected) -> None:
    assert shares(milli) == expected


@pytest.mark.parametrize(
    ("milli", "expected"),
    [(None, UNLIMITED), (0, UNLIMITED), (-5, UNLIMITED), (1, 1000), (9, 1000), (10, 1000), (11, 1100), (500, 50000), (1000, 100000),
     (MAX_MILLI_CPU, MAX_MILLI_CPU * 100)],
)
def test_quota(milli, expected) -> None:
    assert quota(milli) == expected


@pytest.mark.parametrize("milli", [None, 0, 1, 500, 10**6])
def test_quota_switched_off(milli) -> None:
    assert quota(milli, cfs_quota_enabled=False) == UNLIMITED


@pytest.mark.parametrize(("limit", "expected"), [(None, UNLIMITED), (0, UNLIMITED), (-1, UNLIMITED), (1, 1), (128 * 2**20, 128 * 2**20), (2**60, 2**60)])
def test_memory_limit(limit, expected) -> None:
    assert memory_limit(limit) == expected


def test_container_values() -> None:
    spec = spec_of({"main": container("500", "128Mi", "500", "128Mi"), "side": container("250")})
    assert container_values(spec, "main") == CgroupValues(cpu_shares=512, cpu_quota=50000, memory_limit=134217728, cpu_period=CFS_PERIOD)
    assert container_values(spec, "side") == CgroupValues(cpu_shares=256, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)
    assert container_values(spec, "main", cfs_quota_enabled=False).cpu_quota == UNLIMITED


def test_container_quantity_formats() -> None:
    spec = spec_of({"main": container("0.5k", "0.5Gi", "1.5k", "1e9")})
    assert container_values(spec, "main") == CgroupValues(cpu_shares=512, cpu_quota=150000, memory_limit=10**9)


def test_pod_sums_several_containers() -> None:
    spec = spec_of({"a": container("500", "128Mi", "500", "128Mi"), "b": container("1k", "64Mi", "2k", "256Mi")})
    assert pod_values(spec) == CgroupValues(cpu_shares=1536, cpu_quota=250000, memory_limit=384 * 2**20)


def test_pod_unlimited_as_soon_as_one_container_has_no_limit() -> None:
    spec = spec_of({"a": container("500", "128Mi", "500", "128Mi"), "b": container("500", "64Mi")})
    assert pod_values(spec) == CgroupValues(cpu_shares=1024, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)


def test_pod_zero_limit_counts_as_none() -> None:
    spec = spec_of({"a": container(limit_cpu="500", limit_memory="1Gi"), "b": container(limit_cpu="0", limit_memory="1Gi")})
    assert pod_values(spec) == CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=2 * 2**30)


def test_pod_without_containers() -> None:
    assert pod_values(spec_of({})) == CgroupValues(cpu_shares=2, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)


def test_pod_with_init_container_takes_the_larger_of_sum_and_init() -> None:
    app = {"a": container("500", None, "500", "100Mi"), "b": container("500", None, "500", "100Mi")}
    small_init = spec_of(app, init={"setup": container("300", None, "300", "50Mi")})
    assert pod_totals(small_init) == ContainerBatch(cpu_request=1000, cpu_limit=1000, memory_request=0, memory_limit=200 * 2**20)
    big_init = spec_of(app, init={"setup": container("3k", None, "4k", "1Gi"), "other": container("1k", None, "1k", "10Mi")})
    assert pod_totals(big_init) == ContainerBatch(cpu_request=3000, cpu_limit=4000, memory_request=0, memory_limit=2**30)
    unlimited_init = spec_of(app, init={"setup": container("100")})
    assert pod_values(unlimited_init) == CgroupValues(cpu_shares=1024, cpu_quota=UNLIMITED, memory_limit=UNLIMITED)


def test_without_init_section_every_listed_container_is_summed() -> None:
    # Koordinator's annotation cannot mark init containers: the sum is an upper bound.
    spec = spec_of({"setup": container("3k", None, "4k"), "a": container("500", None, "500")})
    assert pod_values(spec).cpu_quota == 450000


def test_pod_totals_are_capped_so_they_fit_int64() -> None:
    spec = spec_of({f"c{i}": container("1G", "1Ei", "1G", "1Ei") for i in range(16)}, init={"setup": container("1G", "1Ei", "1G", "1Ei")})
    assert pod_totals(spec) == ContainerBatch(
        cpu_request=MAX_MILLI_CPU, cpu_limit=MAX_MILLI_CPU, memory_request=MAX_MEMORY_BYTES, memory_limit=MAX_MEMORY_BYTES)
    assert pod_values(spec).memory_limit == MAX_MEMORY_BYTES < 2**63


def test_pod_never_below_a_container() -> None:
    spec = spec_of({"a": container("7", "1", "9", "5000"), "b": container("0", "0", "1", "1")})
    pod = pod_values(spec)
    for name in ("a", "b"):
        values = container_values(spec, name)
        assert pod.cpu_quota >= values.cpu_quota and pod.memory_limit >= values.memory_limit
