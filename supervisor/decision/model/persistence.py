"""What a restarted supervisor gets back: the record fields marked ``kept``, saved and read back by their type.

A field added to a kept record is saved and restored without a list to update: ``kept()`` in its declaration is
all it takes. The state file is one flat JSON object ("rung", "attempt", "lost_seconds", ...): a record marked
``kept(flat=True)`` lends its kept fields to its holder's level (an optional one is absent while None, and read
back where its first key is present). A field's type says how it reads back (``int``, ``float``,
``dict[str, float]``, ``Counter[Reason]``, ``tuple[str, ...]``, a record with ``from_dict`` or kept fields of its
own, an enum); a key that is missing or null gives the field its default. ``save``/``load`` spell a field whose
form in the file is not its type's (the incidents: only the newest and those not yet in incidents.jsonl are kept).
A record people read (an incident) leaves out what is not known: ``omitted`` fields while at their default,
``with_field`` ones unless that field is set. A value not of its field's type, or a field without a default that the
file lacks, is ``Unreadable``, named by its key: the shell treats the file as corrupt rather than run on a half-read
record.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

KEPT = "kept"


class Unreadable(ValueError):
    """A state file's value is not of its field's type, or missing where the field has no default; the message names
    the key (and the keys it sits in)."""


@dataclass(frozen=True)
class Kept:
    key: str | None = None  # its key in the state file, where not the field's name
    flat: bool = False  # a record whose kept fields sit beside its holder's
    save: Callable[[Any], Any] | None = None  # its form in the file, where not its type's
    load: Callable[[Any], Any] | None = None  # ... and back
    omitted: bool = False  # left out while at its default (unknown, or nothing to say)
    with_field: str | None = None  # written exactly while that field is set (not None), even at its default
    was: str | None = None  # its key in an older file, read where the key is missing


def kept(*, key: str | None = None, flat: bool = False, save: Callable[[Any], Any] | None = None,
         load: Callable[[Any], Any] | None = None, omitted: bool = False, with_field: str | None = None,
         was: str | None = None, **field_args: Any) -> Any:
    """A dataclass field that a restarted supervisor gets back (``field()``'s arguments for the rest)."""
    return dataclasses.field(metadata={KEPT: Kept(key, flat, save, load, omitted, with_field, was)}, **field_args)


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


def construct(cls: type, saved: Any) -> Any:
    """A record of ``cls`` from ``saved``, its kept fields read as ``load`` reads them (for frozen records)."""
    _expect(saved, dict)
    return cls(**{f.name: read(f, how, hint, saved) for f, how, hint in kept_fields(cls)})


def read(f: dataclasses.Field, how: Kept, hint: Any, saved: dict[str, Any]) -> Any:
    """The value of the kept field ``f``, of the type ``hint``, in ``saved``; ``Unreadable``, naming its key (and
    the keys it sits in), where it is not of that type or missing without a default."""
    if how.flat:
        record = _without_none(hint)
        if record is not hint and not any(k in saved for k in keys(record)[:1]):
            return None  # an optional record that was not written
        return construct(record, saved)
    key = how.key or f.name
    if key not in saved and how.was in saved:
        key = how.was  # an older file's name for it
    value = saved.get(key)
    if value is None:
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            return default(f)
        if key in saved and _without_none(hint) is not hint:
            return None  # a field without a default that may be unknown (null)
        raise Unreadable(f"{key!r} is {'null' if key in saved else 'missing'}, not {_name(hint)}")
    try:
        return how.load(value) if how.load else from_json(hint, value)
    except Unreadable as e:  # a record's own field: the key it sits in, then its own
        raise Unreadable(f"{key!r}: {e}") from None
    except Exception as e:  # whatever a wrongly typed value breaks in its reader
        raise Unreadable(f"{key!r} is not {_name(hint)} ({type(e).__name__}: {e})") from None


def default(f: dataclasses.Field) -> Any:
    """The field's default; None for a field without one."""
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
    """``value`` read from JSON as the type ``hint`` says; TypeError or ValueError where it is not of that type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, value)
    if origin is list:
        _expect(value, list)
        return [from_json(args[0], v) for v in value]
    if origin is tuple:
        _expect(value, list)
        if args[-1] is Ellipsis:  # tuple[X, ...]
            return tuple(from_json(args[0], v) for v in value)
        if len(value) != len(args):  # tuple[X, Y]
            raise ValueError(f"{len(value)} items, not {len(args)}")
        return tuple(from_json(a, v) for a, v in zip(args, value))
    if origin is dict:
        _expect(value, dict)
        return {_key(args[0], k): from_json(args[1], v) for k, v in value.items()}
    if origin is collections.Counter:  # counts by their key: Counter[Reason]
        _expect(value, dict)
        return collections.Counter({_key(args[0], k): from_json(int, v) for k, v in value.items()})
    if hint is Any:
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hasattr(hint, "from_dict"):
            return hint.from_dict(value)
        return construct(hint, value) if kept_fields(hint) else record_from(hint, value)
    if hint is float:
        _expect(value, (int, float))
        return float(value)
    if hint in (int, str, bool):
        _expect(value, hint)
        return value
    return hint(value)  # an enum


def record_from(cls: type, value: Any, **given: Any) -> Any:
    """The record ``cls`` (without kept fields: all of them are read) from a state file's object, each field read as
    its type says (``given`` as is)."""
    _expect(value, dict)
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: given[f.name] if f.name in given else from_json(hints[f.name], value[f.name])
                  for f in dataclasses.fields(cls) if f.name in value or f.name in given})


def _key(hint: Any, key: str) -> Any:
    return int(key) if hint is int else from_json(hint, key)  # JSON's keys are strings


def _expect(value: Any, types_: Any) -> None:
    if isinstance(value, bool) and types_ is not bool or not isinstance(value, types_):
        raise TypeError(f"got {json.dumps(value, default=str)[:60]}")


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def span(start: float | None, end: float) -> float | None:
    """Seconds from ``start`` to ``end`` (two readings of one clock, both monotonic or both wall clock), kept to the
    millisecond as incidents, rung records and the hang history hold a span; None where ``start`` is unknown."""
    return None if start is None else round(end - start, 3)
