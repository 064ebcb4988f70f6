"""What a restarted supervisor gets back: the record fields marked ``kept``, saved and read back by their type.

A field added to a kept record is saved and restored without a list to update: ``kept()`` in its declaration is
all it takes. The state file is one flat JSON object ("rung", "attempt", "lost_seconds", ...): a record marked
``kept(flat=True)`` lends its kept fields to its holder's level. A field's type says how it reads back (``int``,
``float``, ``dict[str, float]``, a record with ``from_dict``, an enum); a key that is missing or null gives the
field its default. ``save``/``load`` spell a field whose form in the file is not its type's (the incidents: only
the newest and those not yet in incidents.jsonl are kept).
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
        value = saved.get(how.key or f.name)
        if value is None:
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        else:
            value = how.load(value) if how.load else from_json(hint, value)
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
    """``value`` read from JSON as the type ``hint`` says."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, value)
    if origin is list:
        return [from_json(args[0], v) for v in value]
    if origin is dict:
        return {from_json(args[0], k): from_json(args[1], v) for k, v in value.items()}
    if hint is Any:
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint.from_dict(value) if hasattr(hint, "from_dict") else hint(**value)
    return hint(value)  # int, float, str, bool, an enum
