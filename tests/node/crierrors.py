"""kubelet's CRI error lines, normalised so that two runs can be compared.

A CRI error line is an error-level klog line that carries a gRPC status
(`rpc error: code = ...`) or comes from kubelet's CRI client
(remote_runtime.go, remote_image.go). Normalised, it keeps what says *which*
error it is -- the source file, the message and the status code -- and drops
what differs from run to run: time, pid, line number, ids and descriptions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# E1130 22:01:13.476388   17903 remote_runtime.go:121] "message" key="value" ...
_KLOG = re.compile(r"^E\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<file>[\w.-]+):\d+\] (?P<rest>.*)$")
_MESSAGE = re.compile(r'^"(?P<message>(?:[^"\\]|\\.)*)"')
_CODE = re.compile(r"rpc error: code = (?P<code>\w+)")
_CRI_CLIENT_FILES = frozenset({"remote_runtime.go", "remote_image.go"})


@dataclass(frozen=True, order=True)
class CriError:
    file: str
    message: str
    code: str  # the gRPC status code name, "" when the line names none

    def __str__(self) -> str:
        return f"{self.file}: {self.message!r} ({self.code or 'no code'})"


def cri_error(line: str) -> CriError | None:
    """The normalised error if `line` is a CRI error line, else None."""
    match = _KLOG.match(line)
    if match is None:
        return None
    file, rest = match["file"], match["rest"]
    code = _CODE.search(rest)
    if code is None and file not in _CRI_CLIENT_FILES:
        return None
    message = _MESSAGE.match(rest)
    return CriError(file, message["message"] if message else rest, code["code"] if code else "")


def cri_errors(log_text: str) -> set[CriError]:
    return {e for e in map(cri_error, log_text.splitlines()) if e is not None}
