"""A hook file's keys read as koord-runtime-proxy reads them.

koord-runtime-proxy decodes a hook file with Go's ``encoding/json`` into a
struct (``RuntimeHookConfig``), which matches an object's keys to the
struct's in any case (``"Remote-Endpoint"`` is ``remote-endpoint``) and,
for a key given twice in any spellings, keeps the last one in the file:
"preferring an exact match" chooses between two struct fields, never
between two keys of the file. A JSON null leaves a string field as it was
(an earlier value stands, or none), and empties a list. A value of a type
the field cannot take is an error the decoder records and returns once
done, whatever comes after it: koord-runtime-proxy refuses the file, even
when a later value of the key is good (``go_type_problem``). A file written for
it must read the same here, so its three keys (``KOORD_KEYS``) are matched
that way, each spelling that is not ours noted for a warning, as is a key
given twice with different values. The keys of ours are no field of that
struct, which never reads them: they are read as written, and another
spelling of one is an unknown key, ignored, with a warning naming the key
it may have meant (a file that loads must not read otherwise because a key
nobody read before now is).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from ..shown import shown

__all__ = ["KOORD_KEYS", "KeyNote", "KeyedDocument", "Pairs", "go_type_problem", "json_type", "match_keys", "object_pairs"]

# Koordinator's keys, the fields of its struct: read in any case.
KOORD_KEYS = frozenset({"remote-endpoint", "failure-policy", "runtime-hooks"})
# Its string fields: a null there changes nothing (Go's rule for any type but
# a pointer, interface, map or slice). runtime-hooks, a slice, is set to nil
# by a null.
GO_STRING_KEYS = frozenset({"remote-endpoint", "failure-policy"})

# Runes outside ASCII that Go's case folding (unicode.SimpleFold) maps to an
# ASCII letter: the Kelvin sign and the long s. No other does.
_TO_ASCII = str.maketrans({"\u212a": "k", "\u017f": "s"})


def _folded(name: str) -> str:
    """``name`` as Go's encoding/json compares it with an ASCII key: ASCII
    letters in either case, and the two runes above (``str.lower`` would
    fold more: İ, and ß to ss, which Go does not)."""
    return "".join(c.lower() if c.isascii() else c for c in name.translate(_TO_ASCII))


class Pairs(dict[str, object]):
    """A JSON object that keeps its pairs as written, a key given twice included."""

    pairs: tuple[tuple[str, object], ...] = ()


def object_pairs(pairs: list[tuple[str, object]]) -> Pairs:
    """``json.loads``'s ``object_pairs_hook``: a dict (the last of a key wins, as
    in ``json.loads``) that remembers every pair."""
    obj = Pairs(pairs)
    obj.pairs = tuple(pairs)
    return obj


@dataclass(frozen=True)
class KeyNote:
    """A known key written otherwise than we write it, or given twice: read,
    with a warning; or (``read`` false) another spelling of a key of ours:
    ignored, with a warning naming the key it may have meant."""

    written: str  # the key as the file spells it
    key: str  # the known key it is read as, or (not ``read``) the one it may have meant
    message: str
    read: bool = True

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class KeyedDocument:
    """A hook file's top-level object, its keys matched to the known ones."""

    values: Mapping[str, object]  # by known key; other keys as written
    notes: tuple[KeyNote, ...]  # what a warning should say: spellings not ours, keys given twice, ours misspelt
    # (key, why): a value of Koordinator's key that a later one overrode, of a
    # type its Go decoder refuses: the file is refused (go_type_problem)
    problems: tuple[tuple[str, str], ...] = ()


def match_keys(doc: Mapping[str, object], known: Collection[str]) -> KeyedDocument:
    """``doc``'s values by known key, as Go's decoder reads them into
    koord-runtime-proxy's struct (see the module's docstring)."""
    pairs: Iterable[tuple[str, object]] = doc.pairs if isinstance(doc, Pairs) else doc.items()
    by_fold = {_folded(key): key for key in known}
    values: dict[str, object] = {}
    written: dict[str, str] = {}  # known key: the spelling its value came from
    notes: list[KeyNote] = []
    spellings_noted: set[str] = set()
    mistyped: list[tuple[str, str, object]] = []  # Koordinator's keys of a type Go cannot decode: (key, as written, value)
    for name, value in pairs:
        key = name if name in known else by_fold.get(_folded(name), name)
        if key != name and name not in spellings_noted:
            spellings_noted.add(name)
            if key in KOORD_KEYS:
                notes.append(KeyNote(name, key, f'key "{name}" read as "{key}" (koord-runtime-proxy reads keys in any case)'))
            else:  # a key of ours, which koord-runtime-proxy never reads: as written only
                notes.append(KeyNote(name, key, f'key "{name}" ignored: did you mean \'{key}\'? (keys of ours are read as '
                                     "written; only Koordinator's are read in any case)", read=False))
        if key not in KOORD_KEYS and key != name:
            key = name  # unknown: kept as written, ignored
        if key not in known:
            values[name] = value
            continue
        if go_type_problem(key, value) is not None:
            mistyped.append((key, name, value))
        if key in written and values[key] != value:
            earlier = written[key]
            if value is None and key in GO_STRING_KEYS:
                notes.append(KeyNote(name, key, f'"{key}" given twice ("{earlier}", then "{name}": null): the null '
                                     f'changes nothing, as in koord-runtime-proxy; {shown(values[key])} stands'))
                continue
            if go_type_problem(key, values[key]) is None and go_type_problem(key, value) is None:  # else refused
                notes.append(KeyNote(name, key, f'"{key}" given twice ("{earlier}": {as_json(values[key])}, then "{name}": '
                                     f"{as_json(value)}): the last one counts, as in koord-runtime-proxy"))
        elif value is None and key in GO_STRING_KEYS:
            continue  # Go leaves the field as it was: absent, or an earlier value of the same
        values[key], written[key] = value, name
    return KeyedDocument(values, tuple(notes), _overridden_type_problems(mistyped, values))


def go_type_problem(key: str, value: object) -> str | None:
    """Why Go's decoder cannot read ``value`` into Koordinator's field ``key``
    (an UnmarshalTypeError, which fails the whole file), or None."""
    if value is None or key not in KOORD_KEYS:
        return None  # a null is read as no value; our keys are not Go's
    if key in GO_STRING_KEYS:
        return None if isinstance(value, str) else f'"{key}" must be a string, got {json_type(value)}'
    if not isinstance(value, list):
        return f'"{key}" must be a list of hook names, got {json_type(value)}'
    wrong = next((item for item in value if item is not None and not isinstance(item, str)), None)
    return None if wrong is None else f'"{key}" entries must be strings, got {json_type(wrong)}'


def _overridden_type_problems(
    mistyped: list[tuple[str, str, object]], values: Mapping[str, object],
) -> tuple[tuple[str, str], ...]:
    """The mistyped values of Koordinator's keys that a later one of the same
    key overrode: Go records the error and goes on, Unmarshal returns it, and
    koord-runtime-proxy refuses the file whichever value counts. Those of a key
    whose counting value is mistyped itself are left to its own check."""
    problems: list[tuple[str, str]] = []
    for key, name, value in mistyped:
        if go_type_problem(key, values.get(key)) is not None:
            continue
        problem = go_type_problem(key, value)
        problems.append((key, f'{problem} ("{name}": {as_json(value)}, overridden by a later value: koord-runtime-proxy '
                              "refuses the file for it all the same)"))
    return tuple(problems)


# JSON's names for what json.loads returns (bool before int: it is an int subclass).
_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (type(None), "null"), (bool, "boolean"), ((int, float), "number"), (str, "string"), (list, "array"), (dict, "object"),
)


def as_json(value: object) -> str:
    """A value as a message shows it, JSON's null, true and false as JSON writes them (not None, True, False)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return shown(value)


def json_type(value: object) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), type(value).__name__)
