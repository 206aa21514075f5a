"""One hooked call's chain of pre hooks: the request each is sent, built
before it, and its answer applied to the call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from grpc import aio

from ..cripath.unreachable import runtime_gate
from .dispatch import Unbuilt
from .executorbase import Executor, HookRequest
from .hookfile import HookServerConfig
from .points import HookType
from .store import StateStore
from .wholeanswers import WholeAnswers


@dataclass(slots=True)
class PreHooks:
    """One hooked call's pre hooks: its executor and request, what was built
    for the hooks so far. ``build`` and ``apply`` are what
    ``Dispatcher.run_pre`` takes: bound methods of one object a call, rather
    than closures (and the cells of the stage's variables they read) made and
    freed at every hooked call."""

    ex: Executor
    req: Message
    key: str
    hook: HookType
    store: StateStore
    whole: WholeAnswers
    context: aio.ServicerContext
    fields: dict[str, object]
    # Builds so far: the dispatcher builds only for a server it then calls
    # (dispatch.py), so each build follows the calls before it.
    builds: int = 0
    # The hook request the last pre hook was sent, while the call is still
    # what it was built from (None once an answer changed it): the record
    # need not be built again.
    seen: HookRequest | None = None

    async def build(self) -> Any:
        # Before each pre hook: a runtime that died (or said it does not
        # serve) since the chain began stops it (unreachable.py).
        gate = runtime_gate.get()
        if gate is not None and not gate.open():  # builds: whether a hook server was asked
            await gate.enter(self.context, between_hooks=self.builds > 0)
        self.builds += 1
        built = self.ex.hook_request(self.req, self.store)
        if built is None:  # (rarely: a record it needs is read from the runtime)
            built = await self.ex.read_hook_request(self.req, self.store)
        if built is None and not self.store.said_absent(self.key):
            raise Unbuilt(self.key)  # a Fail hook is not bypassed for want of a record
        self.seen = built
        return built

    def apply(self, answer: Any, server: HookServerConfig) -> bool:
        ex, req, shown = self.ex, self.req, self.seen
        clear = self.whole.cleared(ex.emptied(req, answer), server, shown, self.hook, self.fields)
        if not ex.apply(req, answer, shown, clear):
            return False
        self.seen = None
        return True
