"""The command lines' path types: click's, refusing an empty value, which
click (and pathlib) would read as the current directory; typically an
unset variable (``--local-containerd "$DIR"``). A path given is made
absolute as the config file's are (:func:`.config.absolute_path`).

``SOCKET`` is a socket's: an endpoint URL as kubelet and crictl take it
(``unix:///run/x.sock``) is its path, any other URL is refused, as it
would be a relative path (:func:`.endpointurl.endpoint_path`). ``PATH`` is any
other file's or directory's, as written (``--config c:fg.yaml``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import click

from .config import absolute_path
from .endpointurl import EndpointURLError, endpoint_path


class NonEmptyPath(click.Path):
    def __init__(self, *, endpoint: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.endpoint = endpoint  # a socket: an endpoint URL names its path

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path (an unset variable?)", param, ctx)
        if self.endpoint and isinstance(value, str):
            try:
                value = endpoint_path(value)
            except EndpointURLError as exc:
                self.fail(f"{value!r}: {exc}", param, ctx)
        # str | bytes | PathLike in click's stub; a PosixPath with PATH's and SOCKET's path_type=Path.
        path = cast("str | os.PathLike[str]", super().convert(value, param, ctx))
        try:
            return absolute_path(path)
        except RuntimeError:  # ~user of no such user, or no HOME
            self.fail(f"{value!r}: cannot expand ~ (no such user, or no home directory)", param, ctx)


PATH = NonEmptyPath(path_type=Path)
SOCKET = NonEmptyPath(path_type=Path, endpoint=True, readable=False)  # connect needs write, not read
