"""Which node wrote the saved files of a ``stateDir`` (savedreserved.py,
savedplan.py): the systemd machine id (``/etc/machine-id``), read once when
the hook is built (``BalloonsHook(machine_id_path=...)``: tests point it
elsewhere), written in both files and compared at a restart. A stateDir
copied whole from another node (a golden image, a restored backup), of the
same hardware and config, passes every other check (token, fingerprint,
CPUs online): the node's name is what tells it is not this node's.

No machine id (absent, empty, systemd's ``uninitialized`` or the null id
of 32 zeros, or not one): no node check, said once at info when a stateDir
is in use (savedset.py); the files are then written naming no node. Rare
under systemd: PID 1, finding the file empty or ``uninitialized`` at boot,
mounts a transient id over it (committed to disk once /etc is writable),
so the hook normally reads a valid id. With /etc read-only and the id
never committed, though, a new one comes at every boot (random, unless
taken from a VM's UUID): the node refuses its own files after a reboot (a
warning naming both ids) and deduces. Not the hostname instead: it is not
unique (a cloned image keeps it, clusters reuse ``node-1``) so it would
trust a copy all the same, and it changes on the node itself (DHCP, a
cloud rename), where refusing the node's own files loses the reserved CPUs
and balloons a restart keeps (containers moved). No check is what the hook
did before; a wrong refusal would be worse than that.
"""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

MACHINE_ID = "/etc/machine-id"
FIELD = "node"  # the files' key: the machine id of the node that wrote them
NULL_ID = "0" * 32  # SD_ID128_NULL: systemd takes it for no id, as "uninitialized"
_MACHINE_ID = re.compile(r"[0-9a-f]{32}")  # machine-id(5): 32 lowercase hex digits, a newline


class Node(NamedTuple):
    """This node's machine id, or why it has none."""

    id: str  # "": none, no node written nor checked
    missing: str = ""  # why there is none ("/etc/machine-id is empty"): SavedSet says it once a stateDir is in use
    path: str = ""  # the file read


NO_NODE = Node("")  # none, and nothing to say of it (tests' SavedSet)


def read_node(path: str | os.PathLike[str] = MACHINE_ID) -> Node:
    """This node's identity: the machine id in ``path``; none (its id "")
    if there is none, with why. Logs nothing: a hook whose stateDir is off
    has no use for it (SavedSet says it when one is in use)."""
    try:
        # A bounded read: a machine id is 33 bytes; the file is not ours.
        with open(path, "rb") as file:
            text = file.read(256).decode("ascii", "replace").strip()
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or exc})"
    else:
        if _MACHINE_ID.fullmatch(text) and text != NULL_ID:
            return Node(text, path=str(path))
        why = ("is empty" if not text else "is uninitialized" if text == "uninitialized"
               else "is uninitialized (the null id)" if text == NULL_ID else "holds no machine id")
    return Node("", f"{path} {why}", str(path))


def stamp(doc: dict[str, Any], node: str) -> dict[str, Any]:
    """``doc`` (a file's, to write) naming ``node`` (this node's machine id;
    "": none, the key left out), for :func:`foreign` at a restart. An older
    hook ignores the key: the files' versions stay."""
    if node:
        doc[FIELD] = node
    return doc


def foreign(doc: dict[str, Any], here: str) -> str | None:
    """Why ``doc`` (a saved file's) is not this node's: written on a node
    other than ``here`` (this node's id; "": no check), or naming a node not
    a string; None if it may be used. A file naming no node (written by an
    older hook, or on a node without a machine id) is trusted, as before:
    its other checks stand."""
    there = doc.get(FIELD, "")
    if not isinstance(there, str):
        return f"has a {FIELD} not a string"
    if here and there and there != here:
        return (f"was written on the node of machine id {there}, this node's is {here}: a stateDir "
                "carried over from another node (a golden image, a restored backup) is not used")
    return None
