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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["Document", "Repeat"]

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
        too. ``same_key``: what makes two top-level keys one (as written);
        by default, and below the top level, being the same YAML value."""
        found: list[Repeat] = []
        seen: set[int] = set()  # a node reached again through an alias
        for where, node in self._mappings(self.node, "", seen):
            keys: dict[Any, tuple[str, int, yaml.Node]] = {}
            for key_node, value_node in self._pairs[id(node)]:
                if key_node.tag == MERGE_TAG:
                    continue
                written = self._written(key_node)
                key = same_key(written) if same_key is not None and node is self.node else self._key(key_node)
                line = int(key_node.start_mark.line) + 1
                if key in keys:
                    first, first_line, first_value = keys[key]
                    same = _same(self.value(first_value), self.value(value_node))
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
        node = yaml.MappingNode(self.node.tag, list(self._pairs[id(self.node)]), self.node.start_mark, self.node.end_mark)
        self._loader.flatten_mapping(node)
        return [
            (self._written(key_node), int(key_node.start_mark.line) + 1, self.value(value_node))
            for key_node, value_node in node.value
        ]

    def _written(self, key_node: yaml.Node) -> str:
        # `on:` is True to YAML 1.1, `1:` a number: the key is its text.
        return str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else str(self.value(key_node))

    def _key(self, key_node: yaml.Node) -> Any:
        key = self.value(key_node)
        try:
            hash(key)
        except TypeError:  # a list as a key: safe_load refuses it
            return repr(key)
        return (type(key), key)

    def _mappings(self, node: yaml.Node | None, where: str, seen: set[int]) -> Iterator[tuple[str, yaml.MappingNode]]:
        if node is None or id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            yield where, node
            for key_node, value_node in self._pairs[id(node)]:
                inner = where if key_node.tag == MERGE_TAG else _join(where, self._written(key_node))
                yield from self._mappings(value_node, inner, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                yield from self._mappings(item, f"{where}[{i}]", seen)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b
