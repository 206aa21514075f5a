"""The cpuset of the cgroup a container's cgroup is made under, read from the
cgroup v1 cpuset hierarchy, so that a hook answer naming CPUs or memory nodes
outside it is refused up front (validate.outside_parent) rather than by
runc's write of cpuset.cpus (EACCES on the legacy hierarchy).

Where the parent is: a pod cgroup parent as kubelet's cgroupfs driver names
it (``/kubepods/burstable/pod<uid>``) is that path in the hierarchy; a
systemd slice name (``kubepods-burstable-pod<uid>.slice``) is expanded as
runc's systemd driver does (``/kubepods.slice/kubepods-burstable.slice/...``),
and so is the path kubelet's systemd driver sends, which is that expansion
itself. Not judged, the cgroup depending on a driver the proxy does not know:
a path ending in a slice that is not its last slice expanded
(``/system.slice/rt.slice``: ``/rt.slice`` under systemd, containerd keeping
only the last slice; that path, or one under runc's own cgroup, under
cgroupfs), and a relative one (runc puts it under its own cgroup).

Not judged either, the kernel having no such rule there:
 * cgroup v2 (cpuset on the unified hierarchy, or no v1 cpuset mount): a
   child's cpuset.cpus is not bounded by its parent's when written; the
   kernel intersects its effective set instead.
 * v1 mounted with ``cpuset_v2_mode``: the subset check is the legacy
   hierarchy's only outside that mode (is_in_v2_mode).

The mount is found once, at start, and logged at info (``cpuset_mount``:
troubleshooting points there); the parent's files are read only for an
answer that sets a cpuset to other than it was shown (a move alone reads
nothing), each time, so a parent that kubelet or an operator widened since
is seen at once. A parent
that does not exist yet, or whose file is empty, unreadable or no list of
ids, is judged by its nearest ancestor that has one: runc makes missing
cpuset cgroups by copying their parent's sets. One that cannot be read at
all is not judged, nor one no cgroup can be (a NUL in its path) or with a
file that is no text, nor one whose walk up reaches the hierarchy's root: what
is mounted there may not be the node's root (a private cgroup namespace, a
shadowed mount) but the proxy's own cgroup, and the node's root has all
active CPUs and memory nodes, which the node's facts judge already.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Collection
from pathlib import Path

from .validate import ParentCpuset, ParentSet, parse_id_list

__all__ = ["ParentCpusets", "cgroup_path", "expand_slice"]

log = logging.getLogger(__name__)

SLICE = ".slice"
FILES = {"cpuset_cpus": "cpuset.cpus", "cpuset_mems": "cpuset.mems"}  # the CRI field and its cgroup file


def expand_slice(name: str) -> str | None:
    """A systemd slice's path in a cgroup hierarchy, as runc's ExpandSlice makes
    it ("a-b.slice" -> "/a.slice/a-b.slice", "-.slice" -> "/"); None if
    ``name`` is no slice name."""
    if not name.endswith(SLICE) or name == SLICE or "/" in name:
        return None
    stem = name[: -len(SLICE)]
    if stem == "-":
        return "/"
    path, prefix = "", ""
    for part in stem.split("-"):
        if not part:  # "a--b.slice", "-a.slice": systemd refuses them
            return None
        path += f"/{prefix}{part}{SLICE}"
        prefix += f"{part}-"
    return path


def cgroup_path(cgroup_parent: str) -> str | None:
    """The pod cgroup parent's path in the cpuset hierarchy; None where that
    is not known. An absolute path is that path (cgroupfs), a slice name
    expanded (systemd). One whose last element is a slice is that path only
    where it is that slice expanded (as kubelet's systemd driver sends it):
    under systemd containerd keeps only the last slice (``<slice>:<prefix>:<id>``,
    as convert.cgroups_path_under and runtimespec read it) and runc expands it
    alone, so ``/system.slice/rt.slice`` is ``/rt.slice``, but under cgroupfs
    it is not, and the driver is not known here."""
    trimmed = cgroup_parent.rstrip("/")
    base = posixpath.basename(trimmed)
    if base.endswith(SLICE):
        expanded = expand_slice(base)
        if trimmed == base:
            return expanded  # a slice name: systemd's form (cgroupfs's are paths)
        if cgroup_parent.startswith("/") and _clean(cgroup_parent) == expanded:
            return expanded  # the same cgroup under either driver
        return None
    if cgroup_parent.startswith("/"):
        return _clean(cgroup_parent)
    return None


def _clean(path: str) -> str:
    """An absolute path as runc's CleanPath makes it: no ".." gets above the
    hierarchy's root, and a leading "//" is "/" (normpath keeps it: POSIX
    leaves it to the system, Linux takes it as "/")."""
    return "/" + posixpath.normpath(path).lstrip("/")


class ParentCpusets:
    """Reads parent cgroups' cpusets on this node's v1 cpuset hierarchy
    (``mount``: where it is mounted; None: cgroup v2 or not found, nothing read)."""

    def __init__(self, mount: Path | None) -> None:
        self._mount = mount

    @classmethod
    def of_host(cls, root: Path = Path("/")) -> ParentCpusets:
        """This node's, from /proc/self/mountinfo under ``root`` (a fake tree in tests)."""
        try:
            mountinfo = (root / "proc/self/mountinfo").read_text()
        except OSError as err:
            log.info("parent cgroups' cpusets not judged: mounts unreadable", extra={"error": str(err)})
            return cls(None)
        found = _cpuset_mount(mountinfo)
        if found is None:
            log.debug("parent cgroups' cpusets not judged: no cgroup v1 cpuset hierarchy outside cpuset_v2_mode")
            return cls(None)
        mount = root / found.lstrip("/")
        # Once, at start: where an operator finds the parents named (not always
        # /sys/fs/cgroup/cpuset: cpu and cpuset may be mounted together).
        log.info("parent cgroups' cpusets judged", extra={"cpuset_mount": str(mount)})
        return cls(mount)

    @property
    def judged(self) -> bool:
        return self._mount is not None

    @property
    def mount(self) -> Path | None:
        """Where the v1 cpuset hierarchy is mounted (None: not judged)."""
        return self._mount

    def read(self, cgroup_parent: str, fields: Collection[str] = FILES) -> ParentCpuset | None:
        """The cpuset of ``cgroup_parent`` as the kernel will judge a child's by,
        of the ``fields`` asked for (``cpuset_cpus``, ``cpuset_mems``: the others
        are None); None when nothing is read (not judged)."""
        if self._mount is None or not cgroup_parent:
            return None
        path = cgroup_path(cgroup_parent)
        if path is None:
            log.debug("parent cgroup's cpuset not judged: not a path or a slice", extra={"cgroup_parent": cgroup_parent})
            return None
        found = self._nearest(path, [FILES[field] for field in FILES if field in fields])
        if not found:
            log.debug("parent cgroup's cpuset not judged: unreadable", extra={"cgroup_parent": cgroup_parent, "cgroup": path})
            return None
        return ParentCpuset(path, found.get(FILES["cpuset_cpus"]), found.get(FILES["cpuset_mems"]))

    def _nearest(self, path: str, names: list[str]) -> dict[str, ParentSet]:
        """The ids in each file of ``names`` in ``path`` or, where that is missing,
        unreadable, empty or no id list, in its nearest ancestor below the root
        that has some (never tighter than the parent's: on v1 a child's set lies
        within its parent's); one walk up for all, a file found nowhere left out.
        Nothing at all where a path cannot be opened (a NUL in it) or a file is
        not text: the kernel has no such cgroup, or that is not a cpuset file."""
        assert self._mount is not None
        root = str(self._mount)
        found: dict[str, ParentSet] = {}
        at = path
        # The root's is not read (see the module's docstring), however spelt:
        # "//" is its own dirname too, and the walk ends there.
        while posixpath.dirname(at) != at and len(found) < len(names):
            for name in names:
                if name in found:
                    continue
                try:
                    text = self._read_text(f"{root}{at}/{name}").strip()
                except FileNotFoundError:
                    break  # no such cgroup (not made yet): nor the other file
                except OSError:
                    continue
                except ValueError:  # a NUL in the path (the hook's), bytes that are no text: not judged
                    return {}
                try:
                    if text:
                        found[name] = ParentSet(parse_id_list(text), at)
                except ValueError:
                    pass
            at = posixpath.dirname(at)
        return found

    def _read_text(self, path: str) -> str:
        """One cgroup file (tests count them): os.read, about a quarter of what
        pathlib's read_text takes (10 µs against 35-40 on a 2-CPU test VM; a
        whole ``read`` of one file, the parent's path to its ids, about 20 µs:
        see nodefacts' docstring)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks).decode()
        finally:
            os.close(fd)


def _cpuset_mount(mountinfo: str) -> str | None:
    """Where the v1 cpuset hierarchy's root is mounted (proc(5) mountinfo:
    root field "/"), unless it is mounted with cpuset_v2_mode."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 4 or dash < 5 or fields[dash + 1] != "cgroup":
            continue
        options = fields[dash + 3].split(",")
        if "cpuset" not in options or fields[3] != "/":
            continue
        return None if "cpuset_v2_mode" in options else _unescape(fields[4])
    return None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field
