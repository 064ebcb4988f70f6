"""What a restarted supervisor gets back: the record fields marked ``kept``, saved and read back by their type.

A field added to a kept record is saved and restored without a list to update: ``kept()`` in its declaration is
all it takes. The state file is one flat JSON object ("rung", "attempt", "lost_seconds", ...): a record marked
``kept(flat=True)`` lends its kept fields to its holder's level. A field's type says how it reads back (``int``,
``float``, ``dict[str, float]``, a record with ``from_dict``, an enum); a key that is missing or null gives the
field its default. ``save``/``load`` spell a field whose form in the file is not its type's (the incidents: only
the newest and those not yet in incidents.jsonl are kept). A value not of its field's type is ``Unreadable``, named
by its key: the shell treats the file as corrupt rather than run on a half-read record.
"""

from __future__ import annotations

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
    """A state file's value is not of its field's type; the message names the key."""


@dataclass(frozen=True)
class Kept:
    key: str | None = None  # its key in the state file, where not the field's name
    flat: bool = False  # a record whose kept fields sit beside its holder's
    save: Callable[[Any], Any] | None = None  # its form in the file, where not its type's
    load: Callable[[Any], Any] | None = None  # ... and back


def kept(*, key: str | None = None, flat: bool = False, save: Callable[[Any], Any] | None = None,
         load: Callable[[Any], Any] | None = None, **field_args: Any) -> Any:
    """A dataclass field that a restarted supervisor gets back (``field()``'s arguments for the rest)."""
    return dataclasses.field(metadata={KEPT: Kept(key, flat, save, load)}, **field_args)


@functools.cache
def kept_fields(cls: type) -> tuple[tuple[dataclasses.Field, Kept, Any], ...]:
    """(field, how it is kept, its type) for each kept field of the record class ``cls``."""
    hints = typing.get_type_hints(cls)
    return tuple((f, f.metadata[KEPT], hints[f.name]) for f in dataclasses.fields(cls) if KEPT in f.metadata)


def keys(cls: type) -> list[str]:
    """The state file's keys that ``cls`` writes, flat records' included."""
    found: list[str] = []
    for f, how, hint in kept_fields(cls):
        found += keys(hint) if how.flat else [how.key or f.name]
    return found


def dump(record: Any) -> dict[str, Any]:
    """The kept fields of ``record`` as the state file holds them."""
    out: dict[str, Any] = {}
    for f, how, _ in kept_fields(type(record)):
        value = getattr(record, f.name)
        if how.flat:
            out.update(dump(value))
        else:
            out[how.key or f.name] = how.save(value) if how.save else to_json(value)
    return out


def load(record: Any, saved: dict[str, Any]) -> None:
    """Set the kept fields of ``record`` from ``saved`` (a state file's object), in place."""
    for f, how, hint in kept_fields(type(record)):
        if how.flat:
            load(getattr(record, f.name), saved)
            continue
        key = how.key or f.name
        value = saved.get(key)
        if value is None:
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        else:
            try:
                value = how.load(value) if how.load else from_json(hint, value)
            except Exception as e:  # whatever a wrongly typed value breaks in its reader
                raise Unreadable(f"{key!r} is not {_name(hint)} ({type(e).__name__}: {e})") from None
        setattr(record, f.name, value)


def to_json(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(hint: Any, value: Any) -> Any:
    """``value`` read from JSON as the type ``hint`` says; TypeError or ValueError where it is not of that type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, value)
    if origin in (list, tuple):
        _expect(value, list)
        return origin(from_json(args[0], v) for v in value)
    if origin is dict:
        _expect(value, dict)
        return {_key(args[0], k): from_json(args[1], v) for k, v in value.items()}
    if hint is Any:
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint.from_dict(value) if hasattr(hint, "from_dict") else record_from(hint, value)
    if hint is float:
        _expect(value, (int, float))
        return float(value)
    if hint in (int, str, bool):
        _expect(value, hint)
        return value
    return hint(value)  # an enum


def record_from(cls: type, value: Any, **given: Any) -> Any:
    """The record ``cls`` from a state file's object, each field read as its type says (``given`` as is)."""
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
