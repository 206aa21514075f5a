"""The node's facts as the hook path judges answers by them, kept current
across CPU and memory-node hotplug.

Read at start and then only when they may have changed, never once per call:
 * an answer the facts refuse for its cpusets is judged again against facts
   read afresh (a CPU brought online, a node that gained memory, after
   start); one refused only for other fields (a negative quota beside a
   valid cpuset) is not, no read could change that. A re-read that finds
   nothing new holds the next one off for ``hold_off`` seconds, so a hook
   that keeps naming CPUs this node does not have costs a read per second at
   most, not one per call. The price: an answer naming a CPU that came
   online after such a fruitless re-read, and within ``hold_off`` of it, is
   refused (by its server's failure policy) until ``hold_off`` has passed.
   A re-read that found a change holds nothing off: hotplugs in a row are
   each seen at the first answer naming them.
 * on cgroup v1, an answer about to be refused for a cpuset outside its
   parent cgroup's (see below) has them read again first, unless read for it
   already or held off as above: a CPU taken offline leaves every cpuset at
   once, so the node's reason is named, not the parent's (widening that
   parent, as its reason suggests, would fail). A read that finds nothing new
   holds the next such read off for ``hold_off``, so a hook that keeps naming
   CPUs outside its parent costs a read per ``hold_off``; it holds off no read
   for an answer the node's facts refuse (a CPU brought online just after is
   taken at once).
 * facts older than ``max_age`` are read again before an answer naming
   cpusets is judged, so a CPU gone offline is refused at most ``max_age``
   after it went (until then such an answer goes on, and runc fails the
   container with an error naming neither the hook nor the field). Such a
   read that finds nothing new, for an answer still refused for its
   cpusets, holds the next one off as above. This is
   done on the hooked path, not by a background task: nothing to own and stop
   in both the proxy and the NRI plugin, and no read while no hook names a
   cpuset.

On cgroup v2 with a kernel before 5.18 the nodes cpuset.mems takes were fixed
at boot (``NodeFacts.memory_nodes_fixed_at_boot``): a node that gains memory
later is still refused by the kernel, so there a re-read may shrink
``memory_nodes`` but never widens them beyond the first read's.

A re-read that fails keeps the facts that stand and counts as one that found
nothing new; it is warned once per failure in a row (with the facts that
stand) and noted at info when reads work again.

On cgroup v1 a container's cpusets must also lie within those of its pod's
cgroup parent (``parents``, see parentcpuset.py): read for each answer that
sets a cpuset to other than it was shown (an echo of the shown one, as hooks
answering with the full resources send, is not read for), and for the
answers a PreCreateContainer chain took though refused by their parent,
once more at the chain's end (``outside``), never otherwise, and only the
files of the fields so judged: the parent is the one in effect
after the answer (one a PreCreateContainer answer moves its container to),
and a cpuset the answer leaves is not judged, even on a move (in a chain a
later hook may still set it; left outside, runc fails the container), but
for one an earlier hook of the chain set, which the move takes along
(``along``, chaincpuset.py). Not cached, so there is nothing to re-read: a parent kubelet or an
operator widened is seen at the next answer. Also on the event loop, on a
2-CPU test VM: a read of one file about 20 µs all told (its os.read about 10
of it, pathlib's read_text took 35-40), both files about 35 µs, about 60 µs
with a walk three levels up for a parent not made yet (one walk for both).

The re-read happens on the event loop. It is not a few µs: ``read_node_facts``
took about 115 µs on a 2-CPU test VM (four small sysfs and proc files, pathlib
included; a re-read reads two of them, ``NodeFactsReader`` having read the
cgroup mode and the kernel release, which no hotplug changes, once), but it
comes at most once per ``hold_off``, once per ``max_age`` and once per
change, and the call waits for it either way: a thread would add its
hand-over to that call and spare the others only those 115 µs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from cri_api.hookapi import api_pb2 as hookapi

from .parentcpuset import ParentCpusets
from .validate import (
    NODE_FIELDS, NodeFacts, NodeFactsReader, Reason, format_id_list, invalid_answer, outside_parent, set_by,
)

__all__ = ["HOLD_OFF", "MAX_AGE", "NodeFactsSource", "format_id_list"]  # format_id_list: validate's

log = logging.getLogger(__name__)

HOLD_OFF = 1.0  # seconds after a re-read for a refused answer found nothing new
MAX_AGE = 10.0  # seconds: older facts are re-read before a cpuset is judged


class NodeFactsSource:
    """One dispatcher's node facts (not shared: no global state); ``read``
    (default: a ``NodeFactsReader`` of this node, which reads its cgroup mode
    and kernel release once) and ``clock`` are injectable for tests (a fake
    sysfs root, a fake clock)."""

    def __init__(
        self,
        read: Callable[[], NodeFacts] | None = None,
        *,
        parents: ParentCpusets | None = None,
        clock: Callable[[], float] = time.monotonic,
        hold_off: float = HOLD_OFF,
        max_age: float = MAX_AGE,
    ) -> None:
        self._read = read or NodeFactsReader()
        # None: parent cgroups' cpusets are not judged (also where no v1 cpuset hierarchy is found)
        self._parents = parents if parents is not None and parents.judged else None
        self._clock = clock
        self._hold_off = hold_off
        self._max_age = max_age
        self._current = self._read()  # at start, a failed read stops the start
        # A NodeFactsReader's cgroup mode or kernel release not read yet, as
        # of the last read whose facts were taken: one that reads them and
        # then fails still leaves them to be logged as read at last.
        self._unread: tuple[str, ...] = getattr(self._read, "unread", ())
        self._first_memory_nodes = self._current.memory_nodes
        self._read_at = clock()
        self._fruitless_at: float | None = None  # when a re-read for a refused answer last found nothing new
        # The same for an answer refused by its parent's cpuset: held apart, as
        # it holds off only the next such read (not one for a CPU come online).
        self._parent_fruitless_at: float | None = None
        self._failure: str | None = None  # what the last read failed with; None: it worked

    @property
    def current(self) -> NodeFacts:
        return self._current

    def refresh(self) -> bool:
        """Read the facts again now; whether they changed (by a hotplug, or
        by the rule a cgroup mode or kernel release read at last gives, which
        is logged as that, not as a node's change). A failed read keeps
        the last ones and raises nothing: whatever it is, it is not the failure
        of the hook whose answer is being judged."""
        self._read_at = self._clock()
        try:
            fresh = self._read()
        except Exception as err:
            self._read_failed(err)
            return False
        if self._failure is not None:
            log.info("node facts read again", extra={"error_before": self._failure})
            self._failure = None
        if fresh.memory_nodes_fixed_at_boot:  # the kernel adds no node after boot
            fresh = dataclasses.replace(fresh, memory_nodes=fresh.memory_nodes & self._first_memory_nodes)
        old, self._current = self._current, fresh
        # A NodeFactsReader's cgroup mode or kernel release, not read before
        # (EMFILE at start, say): the facts may change with no hotplug, by
        # the rule now known. Changed all the same: judged again by them.
        unread = getattr(self._read, "unread", ())
        at_last = tuple(name for name in self._unread if name not in unread)
        self._unread = unread
        if unread:
            log.debug("node facts read under the stricter rule: not read yet", extra={"unread": list(unread)})
        if fresh == old and not at_last:
            return False
        message = f"{' and '.join(at_last)} read at last (no hotplug); node facts under the rule now known"
        log.info(
            message if at_last else "node facts changed",
            extra={
                "online_cpus_before": format_id_list(old.online_cpus),
                "online_cpus": format_id_list(fresh.online_cpus),
                "memory_nodes_before": format_id_list(old.memory_nodes),
                "memory_nodes": format_id_list(fresh.memory_nodes),
            },
        )
        return fresh != old

    def _read_failed(self, err: Exception) -> None:
        """Warned once per failure in a row (a hook naming absent CPUs brings a
        failing read every ``hold_off``), naming the facts that stand; the
        traceback with the first of an unforeseen kind (not OSError, ValueError)."""
        failure = f"{type(err).__name__}: {err}"
        if failure == self._failure:
            log.debug("node facts not read again, as before", extra={"error": failure})
            return
        self._failure = failure
        log.warning(
            "node facts not read again; the last ones stand",
            exc_info=not isinstance(err, (OSError, ValueError)),
            extra={
                "error": failure,
                "online_cpus": format_id_list(self._current.online_cpus),
                "memory_nodes": format_id_list(self._current.memory_nodes),
            },
        )

    def invalid_answer(
        self, shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources,
        cgroup_parent: str = "", along: frozenset[str] = frozenset(),
    ) -> list[Reason]:
        """``validate.invalid_answer`` against facts read again where they may
        be stale; then, for a container under ``cgroup_parent`` (the one in
        effect after the answer), ``validate.outside_parent``
        against that parent's cpuset read now: the cpusets the answer sets,
        and those of ``along`` it leaves as shown (an earlier hook's, which
        its move takes along). A cpuset already refused by the
        node's facts is not judged again: one reason per field. Before a
        parent is named, facts not read for this answer are read again (unless
        held off): a CPU taken offline leaves every cpuset at once on v1, the
        parent's too, and is the node's reason, not the parent's."""
        reasons, read = self._by_node(shown, answer)
        if self._parents is None or not cgroup_parent:
            return reasons
        outside = self._by_parent(shown, answer, cgroup_parent, reasons, along)
        if outside and not read and not self._held_off(self._parent_fruitless_at, self._fruitless_at):
            if self.refresh():
                reasons = invalid_answer(shown, answer, self._current)
                return reasons + self._by_parent(shown, answer, cgroup_parent, reasons, along)
            self._parent_fruitless_at = self._read_at  # no read per answer that names the parent
        return reasons + outside

    def outside(self, cgroup_parent: str, values: dict[str, str]) -> list[Reason]:
        """Why these cpusets (field: value) would be refused under
        ``cgroup_parent``, read now: the chain's end judges its request so
        (chaincpuset.py); the node's facts judged each value when it came."""
        if self._parents is None or not cgroup_parent:
            return []
        parent = self._parents.read(cgroup_parent, set(values))
        if parent is None:
            return []
        return outside_parent(hookapi.LinuxContainerResources(), hookapi.LinuxContainerResources(**values), parent)  # type: ignore[arg-type]  # values: cpuset fields, all strings

    def _by_parent(
        self, shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources,
        cgroup_parent: str, reasons: list[Reason], along: frozenset[str] = frozenset(),
    ) -> list[Reason]:
        assert self._parents is not None
        judged = (set_by(shown, answer) | along) - {reason.field for reason in reasons}
        if not judged:
            return []  # sets no cpuset of its own (never a read), or the node refused those it sets
        parent = self._parents.read(cgroup_parent, judged)
        if parent is None:
            return []
        if along:  # none of them set by the answer (set_by): those it leaves
            # Judged as if the answer set them: outside_parent judges only
            # what an answer sets to other than it was shown.
            shown, answer = _taking_along(shown, answer, along)
        # Read for every answer setting a cpuset: a parent widened since is taken at once.
        return outside_parent(shown, answer, parent)  # its fields not read are None: not judged

    def _by_node(
        self, shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources
    ) -> tuple[list[Reason], bool]:
        """``validate.invalid_answer`` against facts read again where they may be
        stale; whether they were read for it."""
        if not any(getattr(answer, field) for field in NODE_FIELDS):
            return invalid_answer(shown, answer, self._current), False  # judged by no fact: never a read
        read = self._clock() - self._read_at >= self._max_age
        changed = read and self.refresh()  # a CPU gone offline since
        reasons = invalid_answer(shown, answer, self._current)
        if not any(reason.field in NODE_FIELDS for reason in reasons):
            return reasons, read  # taken, or refused for what no read can change
        if not read and not self._held_off(self._fruitless_at):
            read, changed = True, self.refresh()  # a CPU come online since, say
            if changed:
                return invalid_answer(shown, answer, self._current), read
        if read and not changed:
            self._fruitless_at = self._read_at  # still refused, and read for nothing
        return reasons, read

    def _held_off(self, *fruitless_at: float | None) -> bool:
        """Whether any of these fruitless re-reads was within ``hold_off``."""
        now = self._clock()
        return any(at is not None and now - at < self._hold_off for at in fruitless_at)


def _taking_along(
    shown: hookapi.LinuxContainerResources, answer: hookapi.LinuxContainerResources, fields: frozenset[str],
) -> tuple[hookapi.LinuxContainerResources, hookapi.LinuxContainerResources]:
    """``shown`` and ``answer`` as if the answer set ``fields`` to the values it
    was shown (copies: a move judged for the cpusets it takes along)."""
    before, after = hookapi.LinuxContainerResources(), hookapi.LinuxContainerResources()
    before.CopyFrom(shown)
    after.CopyFrom(answer)
    for field in fields:
        setattr(after, field, getattr(shown, field))
        before.ClearField(field)
    return before, after
