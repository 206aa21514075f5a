"""Regenerate the CRI and hook-API modules.

Two steps, each runnable alone:

* ``--from-upstream DIR``: reduce the upstream protos in DIR (the layout of
  ``shared/``) to schema copies under ``cri_api/*/api.proto``: comments
  stripped, the licence header kept, gogoproto options dropped (they carry no
  wire meaning), imports of vendored copies of well-known messages replaced
  by the message itself (``VENDORED_IMPORTS``).
* always: run grpcio-tools' protoc over the schema copies, writing
  ``api_pb2.py``, its type stub ``api_pb2.pyi`` (the message classes are
  built at import time, so only the stub tells a type checker their names)
  and ``api_pb2_grpc.py`` next to each copy (or into ``--out``, which the
  staleness test uses).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_ROOT.parent

# schema copy (relative to cri_api/) -> upstream file (relative to shared/)
SCHEMAS: dict[str, str] = {
    "v1/api.proto": "cri-api/v1/api.proto",
    "v1alpha2/api.proto": "cri-api/v1alpha2/api.proto",
    "hookapi/api.proto": "koordinator-hook-api/api.proto",
    "nri/api.proto": "nri-api/api.proto",
    "ttrpc/request.proto": "nri-api/ttrpc-request.proto",
}
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

# Imports of a project's own copy of a standard message: the copy is declared
# in the schema instead (same fields and numbers, so the same wire format)
# rather than pulling in a package for one message. ttrpc's
# "proto/status.proto" is google.rpc.Status, declared in package ttrpc.
VENDORED_IMPORTS: dict[str, tuple[str, str]] = {
    "proto/status.proto": (
        'import "google/protobuf/any.proto";',
        "message Status {\n"
        "\tint32 code = 1;\n"
        "\tstring message = 2;\n"
        "\trepeated google.protobuf.Any details = 3;\n"
        "}",
    ),
}

# Upstream files that carry no licence header get their repository's, found
# by their go_package (the licence file sits beside the upstream copy).
LICENCE_BY_GO_PACKAGE: dict[str, str] = {
    "github.com/containerd/ttrpc": (
        "/*\n"
        "   Copyright The containerd Authors.\n\n"
        "   Licensed under the Apache License, Version 2.0 (the \"License\");\n"
        "   see LICENSE-ttrpc beside the upstream file (containerd/ttrpc v1.2.2).\n"
        "*/"
    ),
}


def _strip_comments(text: str) -> str:
    """Remove // and /* */ comments outside string literals."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def reduce_schema(text: str) -> str:
    """The wire schema of an upstream proto: licence header + declarations."""
    header = ""
    m = re.match(r"\s*(/\*.*?\*/)", text, re.S)
    if m and "License" in m.group(1):
        header = m.group(1) + "\n\n"
        text = text[m.end() :]
    else:
        go_package = re.search(r'option\s+go_package\s*=\s*"([^";]*)', text)
        if go_package and go_package.group(1) in LICENCE_BY_GO_PACKAGE:
            header = LICENCE_BY_GO_PACKAGE[go_package.group(1)] + "\n\n"
    body = _strip_comments(text)
    lines = []
    declared: list[str] = []
    for line in body.splitlines():
        stripped = line.rstrip()
        vendored = re.fullmatch(r'\s*import\s+"([^"]+)";', stripped)
        if vendored and vendored.group(1) in VENDORED_IMPORTS:
            stripped, declaration = VENDORED_IMPORTS[vendored.group(1)]
            declared.extend(declaration.splitlines())
        if "gogoproto" in stripped:
            # gogo import, file options and field options like
            # [(gogoproto.nullable) = false]: code-generation hints only.
            if stripped.lstrip().startswith(("import", "option")):
                continue
            stripped = re.sub(r"\s*\[\(gogoproto\.[^\]]*\]", "", stripped)
        lines.append(stripped)
    lines.extend(declared)
    # Blank lines only between top-level declarations.
    out: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        if out and re.match(r"(message|service|enum|option|package|import)\b", line):
            out.append("")
        out.append(line)
    return header + "\n".join(out) + "\n"


def import_upstream(shared: Path) -> None:
    for copy, upstream in SCHEMAS.items():
        src = shared / upstream
        dst = PACKAGE_ROOT / copy
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(reduce_schema(src.read_text()))


def generate(out_root: Path) -> list[Path]:
    """Run protoc for every schema copy; return the files written."""
    from grpc_tools import protoc  # build-time dependency only

    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    written: list[Path] = []
    for copy in SCHEMAS:
        proto = Path("cri_api") / copy
        args = [
            "protoc",
            f"-I{PROJECT_ROOT}",
            f"-I{well_known}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {proto}")
        for suffix in GENERATED_SUFFIXES:
            written.append(out_root / proto.with_name(proto.stem + suffix))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-upstream", type=Path, help="shared/ directory with upstream protos")
    parser.add_argument("--out", type=Path, help="write generated modules under this root instead")
    args = parser.parse_args(argv)
    if args.from_upstream:
        import_upstream(args.from_upstream)
    if args.out:
        generate(args.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for path in generate(Path(tmp)):
                target = PROJECT_ROOT / path.relative_to(tmp)
                shutil.copyfile(path, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
