"""A YAML document read from its composed nodes, so that what the text says
is known as written: each key's spelling and line, and a key given twice in
a mapping (YAML keeps the last without a word). Shared by the proxy's config
(:mod:`.config`) and the hooks' (``hook run --config``).

A key given twice with the same value is harmless but for the reader: a
warning. With different values an edit near the top of the file silently
loses to a line further down: an error. Merge keys (``<<: *base``) are not
keys of their mapping: several are legitimate, and what they merge is
overridden by design.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import yaml

__all__ = ["Document", "Repeat", "check_repeats"]

MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Repeat:
    """A key given twice in one mapping."""

    first: str  # as written the first time
    again: str  # as written the second time (hook-dir, then hook_dir)
    first_line: int  # 1-based
    line: int
    same: bool  # the same value both times
    where: str = ""  # the mapping's place ("" for the top level)

    def __str__(self) -> str:
        name = f"{self.where}.{self.first}" if self.where else self.first
        if self.first == self.again:
            said = f"{name!r} is set twice (lines {self.first_line} and {self.line})"
        else:
            said = f"{name!r} (line {self.first_line}) is set again as {self.again!r} (line {self.line})"
        if self.same:
            return f"{said}, to the same value; keep one"
        return f"{said}, to different values (YAML keeps the last); keep one"


def check_repeats(
    repeats: Iterable[Repeat], error: Callable[[Repeat], Exception], warn: Callable[[Repeat], object]
) -> None:
    """Each reader's rule for keys given twice: ``warn`` of one set to the
    same value, raise ``error`` of the first set to different values."""
    for repeat in repeats:
        if not repeat.same:
            raise error(repeat)
        warn(repeat)


class Document:
    """One YAML document (``safe_load``'s rules), composed once: raises what
    ``yaml.safe_load`` would (``yaml.YAMLError``, ``RecursionError``)."""

    def __init__(self, text: str) -> None:
        self._loader = yaml.SafeLoader(text)
        try:
            self.node: yaml.Node | None = self._loader.get_single_node()
        finally:
            self._loader.dispose()
        # Each mapping's pairs as written: constructing one merges its merge
        # keys into it, in place.
        self._pairs: dict[int, list[tuple[yaml.Node, yaml.Node]]] = {}
        self._record(self.node)
        self._flattened: dict[int, list[tuple[yaml.Node, yaml.Node]]] = {}

    def _record(self, node: yaml.Node | None) -> None:
        stack = [node]
        while stack:
            node = stack.pop()
            if node is None or id(node) in self._pairs:
                continue
            if isinstance(node, yaml.MappingNode):
                self._pairs[id(node)] = list(node.value)
                stack += [n for pair in node.value for n in pair]
            elif isinstance(node, yaml.SequenceNode):
                self._pairs[id(node)] = []  # seen
                stack += node.value

    def value(self, node: yaml.Node | None = None) -> Any:
        """What ``yaml.safe_load`` reads from ``node`` (the whole document by default)."""
        node = self.node if node is None else node
        return None if node is None else self._loader.construct_document(node)

    def repeats(self, same_key: Callable[[str], str] | None = None) -> list[Repeat]:
        """Every key given twice in a mapping of the document, nested ones
        too. ``same_key``: what makes two top-level keys one (as written),
        in the mappings merged into the top level too; by default, and below
        the top level, being one key of the mapping ``safe_load`` builds (1
        and 1.0 are one). Values are compared as nodes, never built: an alias
        of an alias (a billion laughs) is walked once, a recursive one ends."""
        found: list[Repeat] = []
        top = self._merged_into(self.node)
        for where, node in self._mappings():
            keys: dict[Any, tuple[str, int, yaml.Node]] = {}
            for key_node, value_node in self._pairs[id(node)]:
                if key_node.tag == MERGE_TAG:
                    continue
                written = self._written(key_node)
                key = same_key(written) if same_key is not None and id(node) in top else self._key(key_node)
                line = int(key_node.start_mark.line) + 1
                if key in keys:
                    first, first_line, first_value = keys[key]
                    same = self._same_node(first_value, value_node)
                    found.append(Repeat(first, written, first_line, line, same, where))
                else:
                    keys[key] = (written, line, value_node)
        return found

    def top_pairs(self) -> list[tuple[str, int, Any]]:
        """The top-level mapping's keys as written, each with its line and
        value, merge keys expanded (their keys first: the mapping's own
        override them); empty when the document is no mapping."""
        if not isinstance(self.node, yaml.MappingNode):
            return []
        return [
            (self._written(key_node), int(key_node.start_mark.line) + 1, self.value(value_node))
            for key_node, value_node in self._flat(self.node)
        ]

    def _written(self, key_node: yaml.Node) -> str:
        # `on:` is True to YAML 1.1, `1:` a number: the key is its text.
        return str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else str(self.value(key_node))

    def _key(self, key_node: yaml.Node) -> Any:
        """The key as the built mapping holds it: 1 and 1.0 (on and 1) are
        one key there, as they are here."""
        key = self.value(key_node)
        try:
            hash(key)
        except TypeError:  # a list as a key: safe_load refuses it (never repr'd: it may be a billion laughs)
            return _Unhashable()
        return key

    def _merged_into(self, node: yaml.Node | None) -> set[int]:
        """``node`` and the mappings merged into it (``<<: {...}``, ``<<: [*a, *b]``),
        theirs too: the mappings whose keys are ``node``'s."""
        found: set[int] = set()
        stack = [node]
        while stack:
            node = stack.pop()
            if isinstance(node, yaml.SequenceNode):
                stack += node.value
            elif isinstance(node, yaml.MappingNode) and id(node) not in found:
                found.add(id(node))
                stack += [value for key, value in self._pairs[id(node)] if key.tag == MERGE_TAG]
        return found

    def _mappings(self) -> Iterator[tuple[str, yaml.MappingNode]]:
        """Each mapping of the document once, in document order, with its
        place; a loop, not a recursion: as deep as safe_load reads."""
        seen: set[int] = set()  # a node reached again through an alias
        stack: list[tuple[yaml.Node | None, str]] = [(self.node, "")]
        while stack:
            node, where = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                yield where, node
                inner = [
                    (value_node, where if key_node.tag == MERGE_TAG else _join(where, self._written(key_node)))
                    for key_node, value_node in self._pairs[id(node)]
                ]
                stack += reversed(inner)
            elif isinstance(node, yaml.SequenceNode):
                stack += reversed([(item, f"{where}[{i}]") for i, item in enumerate(node.value)])

    def _same_node(self, a: yaml.Node, b: yaml.Node) -> bool:
        """Whether two nodes are the same YAML value: the same kind and tag,
        scalars of the same text or building equal, the same items, the same
        keys (merges applied; each compared as a scalar value is) to the same values. Each pair of nodes is
        looked at once: a pair met again (an alias, a loop) is taken as
        same, its first look decides."""
        memo: set[tuple[int, int]] = set()
        stack = [(a, b)]
        while stack:
            a, b = stack.pop()
            if a is b or (id(a), id(b)) in memo:
                continue
            memo.add((id(a), id(b)))
            if type(a) is not type(b) or a.tag != b.tag:
                return False  # 1 and 1.0: an int and a float
            if isinstance(a, yaml.ScalarNode):
                if a.value != b.value and not _same_scalar(self.value(a), self.value(b)):
                    return False
            elif isinstance(a, yaml.SequenceNode):
                if len(a.value) != len(b.value):
                    return False
                stack += zip(a.value, b.value, strict=True)
            else:
                # (not a scalar or a sequence: a mapping, the third kind of node)
                a, b = cast(yaml.MappingNode, a), cast(yaml.MappingNode, b)
                pairs = self._entries(a), self._entries(b)
                if pairs[0] is None or pairs[1] is None:  # a key that is no scalar: as written, in order
                    flat = self._flat(a), self._flat(b)
                    if len(flat[0]) != len(flat[1]):
                        return False
                    stack += [pair for ab in zip(*flat, strict=True) for pair in zip(*ab, strict=True)]
                    continue
                if pairs[0].keys() != pairs[1].keys():
                    return False
                # The keys' nodes too, as scalars are compared: {1: a} and {1.0: a} differ, as [1] and [1.0] do.
                stack += [pair for key in pairs[0] for pair in zip(pairs[0][key], pairs[1][key], strict=True)]
        return True

    def _flat(self, node: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node]]:
        """A mapping's pairs, merge keys applied (merged pairs first)."""
        flat = self._flattened.get(id(node))
        if flat is None:
            copy = yaml.MappingNode(node.tag, list(self._pairs[id(node)]), node.start_mark, node.end_mark)
            self._loader.flatten_mapping(copy)
            flat = self._flattened[id(node)] = copy.value
        return flat

    def _entries(self, node: yaml.MappingNode) -> dict[Any, tuple[yaml.Node, yaml.Node]] | None:
        """The mapping as built: each key (a later one wins) to its key's and
        value's nodes; None when a key is no scalar."""
        entries: dict[Any, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in self._flat(node):
            if not isinstance(key_node, yaml.ScalarNode):
                return None
            key = self._key(key_node)
            if isinstance(key, _Unhashable):
                return None
            entries[key] = key_node, value_node
        return entries


class _Unhashable:
    """A key no mapping can hold: equal to no other."""


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _same_scalar(a: Any, b: Any) -> bool:
    """Built scalars of one tag: equal, nan too (.nan and .NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b
