"""The executor's interface: how one hooked CRI call reads and writes hooks.

One executor per CRI method (podexecutors.py, containerexecutors.py; the
table of them in executor.py). It names the key that orders calls on the
same object, builds the hook request (from the call, or from the store),
applies a hook's answer to the call, and records the outcome in the store.

What needs a record is asked in two steps: a plain method answers from the
call and the records the store holds (nearly every call), or says it cannot
(None, False); only then its ``read_*`` coroutine reads the runtime for the
record the store lacks (``load``) and asks the plain method again: one copy
of each answer's logic. No coroutine is made that would never await.
"""

from __future__ import annotations

from typing import Any, ClassVar

from google.protobuf.message import Message

from cri_api.hookapi import api_pb2 as hookapi

from .merge import emptied_cpusets
from .points import HookType
from .store import StateStore

# A pod with this label (a hook server's own pod) is never hooked, so a hook
# server running as a pod cannot deadlock its own start.
SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"

HookRequest = hookapi.PodSandboxHookRequest | hookapi.ContainerResourceHookRequest


def opted_out(labels: Any) -> bool:
    """Whether a pod with these labels opted out of hooks (SKIP_LABEL)."""
    return labels.get(SKIP_LABEL, "").lower() == "true"


def copied(record: HookRequest | None) -> HookRequest | None:
    """A hook request from a stored record; hooks must not touch the store's copy."""
    if record is None:
        return None
    out = type(record)()
    out.CopyFrom(record)  # type: ignore[arg-type]  # out is of record's own type
    return out


class Executor:
    request: ClassVar[type[Message]]
    response: ClassVar[type[Message]]
    reads_response: ClassVar[bool] = False  # decode the backend's answer?
    # Calls on one object are serialised through the runtime call, except
    # these, which can take a whole grace period: the next call is issued
    # after them, but does not wait for them to end.
    ordered_until_issued: ClassVar[bool] = False
    # Recorded even while no hook server is registered, when the other calls
    # that keep state go by unrecorded: what it records (the resources) is
    # read back from the runtime only as its spec says, and a read under way
    # when it lands must be told it is stale.
    recorded_without_hooks: ClassVar[bool] = False
    # The hook point whose answers ``carry`` brings into this call: while any
    # hook server is registered (a pod moved by a server since removed still
    # takes its containers along), the call is decoded and carried before it
    # is sent, on either data path. With none, calls go as they came.
    carries_from: ClassVar[HookType | None] = None

    def key(self, req: Any) -> str:
        raise NotImplementedError

    async def carry(self, req: Any, store: StateStore, read_back: bool) -> bool:
        """Bring into the call what earlier hooks changed on its object that the
        client's copy lacks; True if it changed. Before this call's own hooks.
        ``read_back``: an object the records lack may be read from the runtime
        (else only the records count, and the call is not held for a read)."""
        return False

    def skips(self, req: Any, store: StateStore) -> bool | None:
        """Whether the call's pod opted out of hooks; None if the store lacks
        the record that says: ``read_skips`` reads it."""
        return False

    async def load(self, req: Any, store: StateStore) -> None:
        """Read from the runtime into the store the record the plain methods
        need, if the store lacks it (the runtime may have none either)."""

    async def read_skips(self, req: Any, store: StateStore) -> bool:
        """``skips``, reading the runtime for a record the store lacks (a pod
        with none anywhere has not opted out)."""
        await self.load(req, store)
        return bool(self.skips(req, store))

    def hook_request(self, req: Any, store: StateStore) -> HookRequest | None:
        """The request hooks see, from the call and the records the store
        holds; None if there is none so: ``read_hook_request`` says."""
        return None

    async def read_hook_request(self, req: Any, store: StateStore) -> HookRequest | None:
        """The request hooks see, reading the runtime for a record the store
        lacks; None when there is nothing to hook."""
        await self.load(req, store)
        return self.hook_request(req, store)

    def apply(self, req: Any, answer: Any, shown: Any = None, clear: tuple[str, ...] = ()) -> bool:
        """Merge one hook's answer into the CRI request; True if it changed. ``shown``: the hook
        request it answered, if known; ``clear``: the cpusets to empty (``emptied``'s, logged)."""
        return False

    def emptied(self, req: Any, answer: Any) -> tuple[str, ...]:
        """The cpusets of the request (``_resources``) that ``answer``, read whole, clears: only one with
        container_resources, as koord-runtime-proxy applies them (ChainCpusets.cleared judges the same)."""
        resources = self._resources(req)
        if resources is None or not answer.HasField("container_resources"):
            return ()
        return emptied_cpusets(resources, answer.container_resources)

    def _resources(self, req: Any) -> Any:
        return None  # the request's container resources, if it has any

    def record(self, req: Any, resp: Any, store: StateStore, seen: HookRequest | None = None) -> bool:
        """After a successful backend call: True once recorded, False if the
        store lacks a record it needs (``read_record`` records it then).
        ``seen``: the hook request a pre hook was sent, if the call is still
        what it was built from (the executor's to keep: nothing else holds it)."""
        return True

    async def read_record(self, req: Any, resp: Any, store: StateStore, seen: HookRequest | None = None) -> None:
        """``record``, reading the runtime for the record the store lacks."""
        await self.load(req, store)
        self.record(req, resp, store, seen)

    def records_at_once(self, req: Any, store: StateStore, seen: HookRequest | None, post: bool) -> bool:
        """Whether recording, and the hook request of a post hook (``post``),
        end without reading the runtime: the client's answer need not wait for them."""
        return True

    def early_seen(self, req: Any, store: StateStore) -> HookRequest | None:
        """What ``record`` takes as ``seen``, built while the runtime works on
        a call no pre hook saw; None where the record needs nothing built or
        would read the runtime (that waits for the answer)."""
        return None

    async def unsure(self, req: Any, store: StateStore) -> None:
        """After a backend call whose outcome the proxy did not see (its client
        left, the runtime failed or went away): make the records true again."""
