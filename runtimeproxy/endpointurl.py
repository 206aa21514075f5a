"""A socket setting written as an endpoint URL, as kubelet and crictl take
it (``unix:///run/x.sock``): the path it names, or why it names none."""

from __future__ import annotations

import re

__all__ = ["EndpointURLError", "endpoint_path"]


class EndpointURLError(ValueError):
    """A socket written as a URL that names no absolute unix socket path."""


# A URL: unix: (kubelet's and crictl's endpoints, any case), grpc's other
# schemes with no // (unix-abstract:NAME, dns:HOST, ...) or SCHEME://...;
# anything else is a path (c:fg.yaml, proxy:v2.sock).
_URL = re.compile(r"(unix|unix-abstract|dns|vsock|ipv4|ipv6|npipe):|([A-Za-z][A-Za-z0-9+.-]*)://", re.IGNORECASE)


def endpoint_path(text: str) -> str:
    """A socket setting as a path: an endpoint URL as kubelet and crictl take
    it (``unix:///run/x.sock``, ``unix:/run/x.sock``, the scheme in any case)
    is the path it names; anything but a URL is a path as written. An
    EndpointURLError for a URL naming no absolute path, or not surely the one
    kubelet and grpc would name: read as a path it would be a relative one,
    under the current directory (``/`` under systemd)."""
    found = _URL.match(text)
    if found is None:
        return text
    scheme, rest = found.group(1) or found.group(2), text[found.end():]
    if scheme.lower() != "unix":  # unix:// is unix: and //
        raise EndpointURLError(f"expected a unix socket path, not a {scheme}: endpoint")
    if any(c in text for c in "%?#"):
        raise EndpointURLError(
            f"a {scheme}: URL with %, ? or # names another socket to kubelet and grpc (they decode %XX and cut "
            "?query and #fragment): write the socket's path"
        )
    if rest.startswith("//"):
        rest = rest[2:]
        if rest and not rest.startswith("/"):
            raise EndpointURLError(f"{scheme}://HOST/... (a host in the URL) names no socket path: write {scheme}:///PATH or the path")
    elif rest and not rest.startswith("/"):
        raise EndpointURLError(f"{scheme}:NAME is a path relative to the current directory (as grpc reads it): write the socket's absolute path")
    if not rest.strip("/"):
        raise EndpointURLError(f"names no socket path (/ alone is the root directory): write {scheme}:///PATH or the path")
    return "/" + rest.lstrip("/")  # unix:////run/x.sock: /run/x.sock
