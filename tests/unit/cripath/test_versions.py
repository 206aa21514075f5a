"""versions.plan: which client versions are served and where each is sent."""

from __future__ import annotations

import pytest

from runtimeproxy.cripath.methods import V1, V1ALPHA2, ApiVersion
from runtimeproxy.cripath.versions import (
    VersionPlan,
    VersionPlanError,
    parse_serve_versions,
    plan,
)

ONLY_V1 = frozenset({V1})
ONLY_V1ALPHA2 = frozenset({V1ALPHA2})
BOTH = frozenset({V1, V1ALPHA2})

NATIVE = {"v1": "v1", "v1alpha2": "v1alpha2"}
ALL_TO_V1 = {"v1": "v1", "v1alpha2": "v1"}
ALL_TO_V1ALPHA2 = {"v1": "v1alpha2", "v1alpha2": "v1alpha2"}
ERROR = "error"

# (backend versions, serve_versions, backend_version) -> routes (client -> target) or ERROR.
# Every combination of 3 backends x 4 serve settings x 3 backend_version settings.
TABLE: dict[tuple[frozenset[ApiVersion], str, str | None], dict[str, str] | str] = {
    # v1-only backend (containerd 2.x)
    (ONLY_V1, "auto", None): {"v1": "v1"},
    (ONLY_V1, "v1", None): {"v1": "v1"},
    (ONLY_V1, "v1alpha2", None): {"v1alpha2": "v1"},
    (ONLY_V1, "v1,v1alpha2", None): ALL_TO_V1,
    (ONLY_V1, "auto", "v1"): {"v1": "v1"},
    (ONLY_V1, "v1", "v1"): {"v1": "v1"},
    (ONLY_V1, "v1alpha2", "v1"): {"v1alpha2": "v1"},
    (ONLY_V1, "v1,v1alpha2", "v1"): ALL_TO_V1,
    (ONLY_V1, "auto", "v1alpha2"): ERROR,
    (ONLY_V1, "v1", "v1alpha2"): ERROR,
    (ONLY_V1, "v1alpha2", "v1alpha2"): ERROR,
    (ONLY_V1, "v1,v1alpha2", "v1alpha2"): ERROR,
    # v1alpha2-only backend (containerd <= 1.5)
    (ONLY_V1ALPHA2, "auto", None): {"v1alpha2": "v1alpha2"},
    (ONLY_V1ALPHA2, "v1", None): {"v1": "v1alpha2"},
    (ONLY_V1ALPHA2, "v1alpha2", None): {"v1alpha2": "v1alpha2"},
    (ONLY_V1ALPHA2, "v1,v1alpha2", None): ALL_TO_V1ALPHA2,
    (ONLY_V1ALPHA2, "auto", "v1"): ERROR,
    (ONLY_V1ALPHA2, "v1", "v1"): ERROR,
    (ONLY_V1ALPHA2, "v1alpha2", "v1"): ERROR,
    (ONLY_V1ALPHA2, "v1,v1alpha2", "v1"): ERROR,
    (ONLY_V1ALPHA2, "auto", "v1alpha2"): {"v1alpha2": "v1alpha2"},
    (ONLY_V1ALPHA2, "v1", "v1alpha2"): {"v1": "v1alpha2"},
    (ONLY_V1ALPHA2, "v1alpha2", "v1alpha2"): {"v1alpha2": "v1alpha2"},
    (ONLY_V1ALPHA2, "v1,v1alpha2", "v1alpha2"): ALL_TO_V1ALPHA2,
    # backend serving both (containerd 1.6/1.7)
    (BOTH, "auto", None): NATIVE,
    (BOTH, "v1", None): {"v1": "v1"},
    (BOTH, "v1alpha2", None): {"v1alpha2": "v1alpha2"},
    (BOTH, "v1,v1alpha2", None): NATIVE,
    # forcing a version changes where calls go, not what is served
    (BOTH, "auto", "v1"): ALL_TO_V1,
    (BOTH, "v1", "v1"): {"v1": "v1"},
    (BOTH, "v1alpha2", "v1"): {"v1alpha2": "v1"},
    (BOTH, "v1,v1alpha2", "v1"): ALL_TO_V1,
    (BOTH, "auto", "v1alpha2"): ALL_TO_V1ALPHA2,
    (BOTH, "v1", "v1alpha2"): {"v1": "v1alpha2"},
    (BOTH, "v1alpha2", "v1alpha2"): {"v1alpha2": "v1alpha2"},
    (BOTH, "v1,v1alpha2", "v1alpha2"): ALL_TO_V1ALPHA2,
}


def _id(key: tuple[frozenset[ApiVersion], str, str | None]) -> str:
    backend, serve, forced = key
    return f"backend={'+'.join(sorted(backend))}-serve={serve}-force={forced}"


def test_table_covers_every_combination() -> None:
    assert len(TABLE) == 3 * 4 * 3


@pytest.mark.parametrize("key", [k for k, v in TABLE.items() if v != ERROR], ids=_id)
def test_plan_routes(key: tuple[frozenset[ApiVersion], str, str | None]) -> None:
    backend, serve, forced = key
    expected = TABLE[key]
    assert isinstance(expected, dict)
    result = plan(backend, serve, forced)
    assert dict(result.routes) == expected
    assert result.served == frozenset(expected)
    # Targets are always versions the backend serves (and the forced one if any).
    assert set(result.routes.values()) <= backend
    if forced is not None:
        assert set(result.routes.values()) == {forced}
        assert result.backend_version == forced
    # The proxy's own calls use v1 whenever any route goes to v1.
    assert result.backend_version == ("v1" if "v1" in result.routes.values() else "v1alpha2")
    assert all(isinstance(k, ApiVersion) and isinstance(v, ApiVersion) for k, v in result.routes.items())


@pytest.mark.parametrize("key", [k for k, v in TABLE.items() if v == ERROR], ids=_id)
def test_forcing_a_version_the_backend_lacks_is_an_error(key: tuple[frozenset[ApiVersion], str, str | None]) -> None:
    backend, serve, forced = key
    with pytest.raises(VersionPlanError) as err:
        plan(backend, serve, forced)
    message = str(err.value)
    assert f"backend-version {forced} forced" in message
    assert f"the backend serves only {', '.join(sorted(backend))}" in message


def test_routes_cannot_be_changed() -> None:
    result = plan(BOTH, "auto", None)
    with pytest.raises(TypeError):
        result.routes[V1] = V1ALPHA2  # type: ignore[index]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", None),
        ("  auto ", None),
        ("v1", {"v1"}),
        ("v1alpha2", {"v1alpha2"}),
        ("v1,v1alpha2", {"v1", "v1alpha2"}),
        ("v1alpha2, v1", {"v1", "v1alpha2"}),
        (" v1 ,, v1 ,", {"v1"}),
    ],
)
def test_parse_serve_versions(value: str, expected: set[str] | None) -> None:
    parsed = parse_serve_versions(value)
    if expected is None:
        assert parsed is None
    else:
        assert parsed == frozenset(expected)
        assert all(isinstance(v, ApiVersion) for v in parsed)


@pytest.mark.parametrize("value", ["", " ", ",", "v2", "v1,v2", "V1", "v1alpha1", "auto,v1", "all"])
def test_unknown_serve_versions_are_errors(value: str) -> None:
    with pytest.raises(VersionPlanError, match="expected auto or a list of v1, v1alpha2"):
        parse_serve_versions(value)
    with pytest.raises(VersionPlanError, match="serve-versions"):
        plan(BOTH, value, None)


@pytest.mark.parametrize("forced", ["v2", "V1", "", "auto"])
def test_unknown_backend_version_is_an_error(forced: str) -> None:
    with pytest.raises(VersionPlanError, match=f"backend-version {forced!r}: expected one of v1, v1alpha2"):
        plan(BOTH, "auto", forced)


def test_version_plan_error_is_a_value_error() -> None:
    assert issubclass(VersionPlanError, ValueError)


@pytest.mark.parametrize(
    ("backend", "serve", "forced", "text"),
    [
        (ONLY_V1, "v1,v1alpha2", None, "serving v1 (native), v1alpha2 (translated to v1)"),
        (ONLY_V1, "auto", None, "serving v1 (native)"),
        (ONLY_V1, "v1alpha2", None, "serving v1alpha2 (translated to v1)"),
        (ONLY_V1ALPHA2, "v1,v1alpha2", None, "serving v1 (translated to v1alpha2), v1alpha2 (native)"),
        (ONLY_V1ALPHA2, "auto", None, "serving v1alpha2 (native)"),
        (ONLY_V1ALPHA2, "v1", None, "serving v1 (translated to v1alpha2)"),
        (BOTH, "auto", None, "serving v1 (native), v1alpha2 (native)"),
        (BOTH, "auto", "v1", "serving v1 (native), v1alpha2 (translated to v1)"),
        (BOTH, "auto", "v1alpha2", "serving v1 (translated to v1alpha2), v1alpha2 (native)"),
        (BOTH, "v1alpha2,v1", None, "serving v1 (native), v1alpha2 (native)"),
    ],
)
def test_describe(backend: frozenset[ApiVersion], serve: str, forced: str | None, text: str) -> None:
    assert plan(backend, serve, forced).describe() == text


def test_describe_orders_v1_first_whatever_the_mapping_order() -> None:
    from types import MappingProxyType

    p = VersionPlan(MappingProxyType({V1ALPHA2: V1, V1: V1}))
    assert p.describe() == "serving v1 (native), v1alpha2 (translated to v1)"
    assert p.backend_version == V1
    only_old = VersionPlan(MappingProxyType({V1: V1ALPHA2}))
    assert only_old.backend_version == V1ALPHA2
    assert only_old.served == frozenset({V1})
