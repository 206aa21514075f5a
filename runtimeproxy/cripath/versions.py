"""Which CRI versions the proxy serves, and in which version each is sent on.

kubelet 1.19-1.22 speak only v1alpha2, 1.26+ only v1; containerd <= 1.5 serves
only v1alpha2, 2.x only v1. A client version the backend serves goes through
natively; one it lacks is translated (same bytes, other method path).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..shown import shown
from .backend import CRI_VERSIONS
from .methods import ApiVersion


class VersionPlanError(ValueError):
    pass


@dataclass(frozen=True)
class VersionPlan:
    # client version -> the version its calls are sent to the backend in
    routes: Mapping[ApiVersion, ApiVersion]

    @property
    def backend_version(self) -> ApiVersion:
        """The version the proxy's own calls (state reads) use towards the backend."""
        return ApiVersion.V1 if ApiVersion.V1 in self.routes.values() else ApiVersion.V1ALPHA2

    @property
    def served(self) -> frozenset[ApiVersion]:
        return frozenset(self.routes)

    def describe(self) -> str:
        parts = []
        for client in CRI_VERSIONS:
            if client in self.routes:
                target = self.routes[client]
                parts.append(f"{client} (native)" if target == client else f"{client} (translated to {target})")
        return "serving " + ", ".join(parts)


def parse_serve_versions(value: str) -> frozenset[ApiVersion] | None:
    """'auto' -> None; 'v1,v1alpha2' -> the set; anything else is an error."""
    value = value.strip()
    if value == "auto":
        return None
    versions = frozenset(v.strip() for v in value.split(",") if v.strip())
    unknown = versions - set(CRI_VERSIONS)
    if not versions or unknown:
        raise VersionPlanError(
            f"serve-versions {shown(value)}: expected auto or a list of {', '.join(CRI_VERSIONS)}"
        )
    return frozenset(ApiVersion(v) for v in versions)


def plan(
    backend_versions: frozenset[ApiVersion], serve_versions: str, backend_version: str | None
) -> VersionPlan:
    """Decide the routes from what the backend answered and what was asked."""
    wanted = parse_serve_versions(serve_versions)
    if backend_version is not None:
        if backend_version not in CRI_VERSIONS:
            raise VersionPlanError(f"backend-version {backend_version!r}: expected one of {', '.join(CRI_VERSIONS)}")
        if backend_version not in backend_versions:
            raise VersionPlanError(
                f"backend-version {backend_version} forced, but the backend serves only {', '.join(sorted(backend_versions))}"
            )
        usable = frozenset({ApiVersion(backend_version)})
    else:
        usable = backend_versions
    preferred = ApiVersion.V1 if ApiVersion.V1 in usable else ApiVersion.V1ALPHA2
    # auto: what the backend serves, even when one version is forced towards it
    served = backend_versions if wanted is None else wanted
    routes = {client: (client if client in usable else preferred) for client in CRI_VERSIONS if client in served}
    return VersionPlan(MappingProxyType(routes))
