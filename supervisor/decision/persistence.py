"""What a restarted supervisor gets back: the record fields marked ``kept``, saved and read back by their type.

A field added to a kept record is saved and restored without a list to update: ``kept()`` in its declaration is
all it takes. The state file is one flat JSON object ("rung", "attempt", "lost_seconds", ...): a record marked
``kept(flat=True)`` lends its kept fields to its holder's level (an optional one is absent while None, and read
back where its first key is present). A field's type says how it reads back (``int``, ``float``,
``dict[str, float]``, ``tuple[str, ...]``, a record with ``from_dict`` or kept fields of its own, an enum); a key
that is missing or null gives the field its default. ``save``/``load`` spell a field whose form in the file is not
its type's (the incidents: only the newest and those not yet in incidents.jsonl are kept). A record people read
(an incident) leaves out what is not known: ``omitted`` fields while at their default, ``with_field`` ones unless
that field is set.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

KEPT = "kept"


@dataclass(frozen=True)
class Kept:
    key: str | None = None  # its key in the state file, where not the field's name
    flat: bool = False  # a record whose kept fields sit beside its holder's
    save: Callable[[Any], Any] | None = None  # its form in the file, where not its type's
    load: Callable[[Any], Any] | None = None  # ... and back
    omitted: bool = False  # left out while at its default (unknown, or nothing to say)
    with_field: str | None = None  # written exactly while that field is set (not None), even at its default


def kept(*, key: str | None = None, flat: bool = False, save: Callable[[Any], Any] | None = None,
         load: Callable[[Any], Any] | None = None, omitted: bool = False, with_field: str | None = None,
         **field_args: Any) -> Any:
    """A dataclass field that a restarted supervisor gets back (``field()``'s arguments for the rest)."""
    return dataclasses.field(metadata={KEPT: Kept(key, flat, save, load, omitted, with_field)}, **field_args)


@functools.cache
def kept_fields(cls: type) -> tuple[tuple[dataclasses.Field, Kept, Any], ...]:
    """(field, how it is kept, its type) for each kept field of the record class ``cls``."""
    hints = typing.get_type_hints(cls)
    return tuple((f, f.metadata[KEPT], hints[f.name]) for f in dataclasses.fields(cls) if KEPT in f.metadata)


def keys(cls: type) -> list[str]:
    """The state file's keys that ``cls`` writes, flat records' included."""
    found: list[str] = []
    for f, how, hint in kept_fields(cls):
        found += keys(_without_none(hint)) if how.flat else [how.key or f.name]
    return found


def dump(record: Any) -> dict[str, Any]:
    """The kept fields of ``record`` as the state file holds them."""
    out: dict[str, Any] = {}
    for f, how, _ in kept_fields(type(record)):
        value = getattr(record, f.name)
        if how.with_field is not None and getattr(record, how.with_field) is None \
                or how.omitted and value == default(f):
            continue
        if how.flat:
            out.update(dump(value) if value is not None else {})
        else:
            out[how.key or f.name] = how.save(value) if how.save else to_json(value)
    return out


def load(record: Any, saved: dict[str, Any]) -> None:
    """Set the kept fields of ``record`` from ``saved`` (a state file's object), in place."""
    for f, how, hint in kept_fields(type(record)):
        if how.flat and getattr(record, f.name) is not None:
            load(getattr(record, f.name), saved)
        else:
            setattr(record, f.name, read(f, how, hint, saved))


def construct(cls: type, saved: dict[str, Any]) -> Any:
    """A record of ``cls`` from ``saved``, its kept fields read as ``load`` reads them (for frozen records)."""
    return cls(**{f.name: read(f, how, hint, saved) for f, how, hint in kept_fields(cls)})


def read(f: dataclasses.Field, how: Kept, hint: Any, saved: dict[str, Any]) -> Any:
    """The value of the kept field ``f``, of the type ``hint``, in ``saved``."""
    if how.flat:
        record = _without_none(hint)
        if record is not hint and not any(k in saved for k in keys(record)[:1]):
            return None  # an optional record that was not written
        return construct(record, saved)
    value = saved.get(how.key or f.name)
    if value is None:
        return default(f)
    return how.load(value) if how.load else from_json(hint, value)


def default(f: dataclasses.Field) -> Any:
    """The field's default; None for a field without one (a record's required fields, unknown in the file)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _without_none(hint: Any) -> Any:
    """``X`` of ``X | None``; ``hint`` itself otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner
    return hint


def to_json(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        if hasattr(value, "to_dict"):
            return value.to_dict()
        if kept_fields(type(value)):
            return dump(value)
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k) if isinstance(k, int) else to_json(k): to_json(v) for k, v in value.items()}  # JSON's keys
    return value


def from_json(hint: Any, value: Any) -> Any:
    """``value`` read from JSON as the type ``hint`` says."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, value)
    if origin is list:
        return [from_json(args[0], v) for v in value]
    if origin is tuple:  # tuple[X, ...]
        return tuple(from_json(args[0], v) for v in value)
    if origin is dict:
        return {from_json(args[0], k): from_json(args[1], v) for k, v in value.items()}
    if hint is Any:
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hasattr(hint, "from_dict"):
            return hint.from_dict(value)
        if kept_fields(hint):
            return construct(hint, value)
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: from_json(hints[f.name], value[f.name]) for f in dataclasses.fields(hint)
                       if f.name in value})
    return hint(value)  # int, float, str, bool, an enum
