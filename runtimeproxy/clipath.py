"""The command lines' path type: click's, refusing an empty value, which
click (and pathlib) would read as the current directory; typically an
unset variable (``--local-containerd "$DIR"``), and an endpoint URL
(``unix:///run/x.sock``), which would be a relative path. A path given is
made absolute as the config file's are (:func:`.config.absolute_path`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .config import absolute_path, not_a_url, url_spelt_path


class NonEmptyPath(click.Path):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path (an unset variable?)", param, ctx)
        if isinstance(value, str) and (url_path := url_spelt_path(value)) is not None:
            self.fail(f"{value!r}: {not_a_url(url_path)}", param, ctx)
        path = super().convert(value, param, ctx)
        try:
            return absolute_path(path)
        except RuntimeError:  # ~user of no such user, or no HOME
            self.fail(f"{value!r}: cannot expand ~ (no such user, or no home directory)", param, ctx)


PATH = NonEmptyPath(path_type=Path)
