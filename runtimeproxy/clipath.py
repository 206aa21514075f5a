"""The command lines' path type: click's, refusing an empty value, which
click (and pathlib) would read as the current directory; typically an
unset variable (``--local-containerd "$DIR"``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


class NonEmptyPath(click.Path):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path (an unset variable?)", param, ctx)
        return super().convert(value, param, ctx)


PATH = NonEmptyPath(path_type=Path)
