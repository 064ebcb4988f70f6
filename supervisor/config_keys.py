"""The vocabulary the configuration's keys are declared in (supervisor/config.py), once each: where the key sits in
the file, its kind (what it takes, read into the value the code holds), its default and what it does. Reading a file,
the unknown-key check and the reference (docs/configuration.md) all derive from these declarations.

Every refusal is one line: the file, the key and the form expected (the fix), raised as ConfigError; the CLI turns it
into exit status 78 (EX_CONFIG). Time is seconds as a positive number; the few keys that take a duration ("90s",
"10m", "1h30m") or a word ("auto": derived from what is observed, "off": None, no limit) read it with one function,
``parse_seconds``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

AUTO = "auto"


class ConfigError(ValueError):
    """A configuration the supervisor refuses; the message is one line: file, key, expected form."""


class Reader:
    """The reading of one file: what it is called in messages and the directory its relative paths start from."""

    def __init__(self, label: str, base: Path):
        self.label, self.base = label, base

    def refuse(self, line: str) -> NoReturn:
        raise ConfigError(f"{self.label}: {line}")

    def fail(self, where: str, expected: str, got: Any) -> NoReturn:
        shown = str(got).lower() if isinstance(got, bool) else repr(got)  # as TOML spells it
        self.refuse(f"{where}: expected {expected}, got {shown}")

    def missing(self, where: str, expected: str, needed_by: str) -> NoReturn:
        """A key that must be written and is not: which, what needs it, and what to write."""
        self.refuse(f"{where}: not set, and {needed_by} needs it: expected {expected}")

    def table(self, section: str, table: Any, allowed: set[str]) -> None:
        """A table, of known keys only (a misspelt key is refused, not ignored)."""
        if not isinstance(table, dict):
            self.fail(section, "a table", table)
        for name in table:
            if name not in allowed:
                self.refuse(f"{f'[{section}]' if section else 'top level'}: unknown key {name!r}; expected one of "
                            f"{', '.join(sorted(allowed))}")

    def no_nul(self, where: str, values: list[str]) -> None:
        """No process can be given a NUL character in an argument, a path or the environment: refused here."""
        if any("\0" in v for v in values):
            self.fail(where, "text without a NUL character (\\u0000)", values if len(values) > 1 else values[0])


class Kind:
    """What a key takes. ``expected`` says the form in words: the fix a refusal suggests, and the reference's
    "takes" column; ``read`` returns the value the code holds, or refuses through the reader."""

    expected = ""

    def read(self, value: Any, where: str, reader: Reader) -> Any:
        raise NotImplementedError


def one_of(choices: tuple[str, ...]) -> str:
    """'"auto", "on" or "off"': the expected form of a key that takes one of ``choices``."""
    return ", ".join(f'"{c}"' for c in choices[:-1]) + f' or "{choices[-1]}"'


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The longest any bound, interval or window may be. A supervisor watches a training night by night: a phase it would
# wait more than a day for is no bound but a slip of the keyboard (1e308, "1000d"), and such a deadline overflows the
# waits it is given to (select's timeout). "off", where a key takes it, is the way to say no limit.
LONGEST = 86400.0


def parse_seconds(value: Any, words: dict[str, Any] | None = None, durations: bool = True) -> Any:
    """Seconds from a positive number, or from a duration such as "90s", "10m", "2h", "1h30m" (where ``durations``),
    or what one of ``words`` stands for ("off": None, "auto": AUTO); ValueError if it is none of them."""
    if isinstance(value, str) and value in (words or {}):
        return words[value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value) and value > 0:
            return float(value)
    elif durations and isinstance(value, str) and re.fullmatch(r"\s*((?:\d+(?:\.\d+)?\s*[smhd]\s*)+)", value):
        total = sum(float(n) * DURATION_UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", value))
        if total > 0:
            return total
    raise ValueError(f"not seconds: {value!r}")


class Seconds(Kind):
    """Seconds, from ``least`` (exclusive at 0) to ``most`` (a day, LONGEST, unless said); a duration string where
    ``durations``; and ``words``."""

    def __init__(self, *, words: dict[str, Any] | None = None, durations: bool = False, least: float = 0.0,
                 most: float = LONGEST, expected: str | None = None, beyond: str | None = None):
        self.words, self.durations, self.least, self.most = words or {}, durations, least, most
        others = (['a duration such as "10m"'] if durations else []) + [f'"{w}"' for w in self.words]
        self.expected = expected or " or ".join(["seconds (a positive number)"] + others)
        # said when the value is seconds, but out of bounds
        self.beyond = beyond or (" or ".join([f"seconds up to a day ({LONGEST:g})"] + others) if most == LONGEST
                                 and expected is None else self.expected)

    def read(self, value: Any, where: str, reader: Reader) -> Any:
        try:
            seconds = parse_seconds(value, self.words, self.durations)
        except ValueError:
            reader.fail(where, self.expected, value)
        if isinstance(seconds, float) and not self.least <= seconds <= self.most:
            reader.fail(where, self.beyond, value)
        return seconds


class Whole(Kind):
    """A whole number, at least ``least`` (None: any), at most ``most`` (None: any)."""

    def __init__(self, least: int | None = 1, expected: str | None = None, most: int | None = None):
        self.least, self.most = least, most
        self.expected = expected or f"a whole number >= {least}" + (f" and <= {most}" if most is not None else "")

    def read(self, value: Any, where: str, reader: Reader) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or self.least is not None and value < self.least \
                or self.most is not None and value > self.most:
            reader.fail(where, self.expected, value)
        return value


class Flag(Kind):
    expected = "true or false"

    def read(self, value: Any, where: str, reader: Reader) -> bool:
        if not isinstance(value, bool):
            reader.fail(where, self.expected, value)
        return value


class Choice(Kind):
    def __init__(self, choices: tuple[str, ...]):
        self.choices = choices
        self.expected = one_of(choices)

    def read(self, value: Any, where: str, reader: Reader) -> str:
        if value not in self.choices:
            reader.fail(where, self.expected, value)
        return value


class Text(Kind):
    """A string a process can be given (no NUL); ``pattern``: one it must match whole."""

    def __init__(self, expected: str = "a string", pattern: str | None = None):
        self.expected, self.pattern = expected, pattern

    def read(self, value: Any, where: str, reader: Reader) -> str:
        if not isinstance(value, str) or self.pattern and not re.fullmatch(self.pattern, value):
            reader.fail(where, self.expected, value)
        reader.no_nul(where, [value])
        return value


class Folder(Kind):
    """A directory, relative to the config file; ``existing``: one that exists now (held resolved)."""

    def __init__(self, expected: str, existing: bool = False):
        self.expected, self.existing = expected, existing

    def read(self, value: Any, where: str, reader: Reader) -> Path:
        path = reader.base / os.path.expanduser(Text().read(value, where, reader))
        if not self.existing:
            return path.absolute()
        if not path.resolve().is_dir():
            reader.fail(where, self.expected, str(path.resolve()))
        return path.resolve()


def parse_address(text: Any, lowest_port: int = 0) -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:PORT`` for IPv6) -> (host, port); ValueError if it is not one. Host names resolve at
    run time, not here: no DNS in a check."""
    host, _, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    host = host.strip("[]")
    if host and port.isdigit() and lowest_port <= int(port) <= 65535:
        try:
            ipaddress.ip_address(host)
            return host, int(port)
        except ValueError:
            if re.fullmatch(r"(?!-)[A-Za-z0-9-]{1,63}(?:\.(?!-)[A-Za-z0-9-]{1,63})*\.?", host):
                return host, int(port)
    raise ValueError(f"not HOST:PORT: {text!r}")


class Address(Kind):
    """``"HOST:PORT"``, held as written (or what one of ``words`` stands for)."""

    def __init__(self, expected: str, lowest_port: int = 0, words: dict[str, Any] | None = None):
        self.expected, self.lowest_port, self.words = expected, lowest_port, words or {}

    def read(self, value: Any, where: str, reader: Reader) -> Any:
        if isinstance(value, str) and value in self.words:
            return self.words[value]
        try:
            parse_address(value, self.lowest_port)
        except ValueError:
            reader.fail(where, self.expected, value)
        return value


class Argv(Kind):
    """A command's words (or its added arguments): a list of strings, run without a shell."""

    def __init__(self, example: str, empty_words: bool = False, some: bool = False):
        self.expected = f"a list of strings, e.g. {example}"
        self.empty_words, self.some = empty_words, some

    def read(self, value: Any, where: str, reader: Reader) -> tuple[str, ...]:
        if not isinstance(value, list) or self.some and not value or \
                not all(isinstance(a, str) and (a or self.empty_words) for a in value):
            reader.fail(where, self.expected, value)
        reader.no_nul(where, value)
        return tuple(value)


class Strings(Kind):
    """A table of strings; ``environment``: variables, named as an environment can hold them."""

    def __init__(self, example: str, environment: bool = True):
        self.example, self.environment = example, environment
        self.expected = f"a table of strings, e.g. {example}"

    def read(self, value: Any, where: str, reader: Reader) -> dict[str, str]:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            reader.fail(where, self.expected, value)
        if self.environment:
            for name in value:
                if not name or "=" in name or "\0" in name:
                    reader.fail(where, f'variable names without "=" or a NUL character, e.g. {self.example}', name)
            reader.no_nul(where, list(value.values()))
        else:
            reader.no_nul(where, [*value, *value.values()])
        return dict(value)


DEADLINE_FORM = 'an RFC 3339 time, e.g. deadline = "2025-11-30T00:00:00Z"'


def parse_deadline(text: str | None, source: str = "<config>") -> float | None:
    """The deadline as a Unix timestamp; a time without an offset is local time. ConfigError if unreadable."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except (ValueError, AttributeError):
        Reader(source, Path()).fail("deadline", DEADLINE_FORM, text)
    return moment.timestamp() if moment.tzinfo else moment.astimezone().timestamp()


class Moment(Kind):
    """A time (RFC 3339, or a TOML date-time), held as written for display."""

    expected = DEADLINE_FORM

    def read(self, value: Any, where: str, reader: Reader) -> str:
        text = value if isinstance(value, str) or not hasattr(value, "isoformat") else value.isoformat()
        parse_deadline(text, reader.label)
        return text


@dataclass(frozen=True)
class Key:
    """A configuration key: ``section.name`` in the file ("" the top level), and the rest of its declaration."""

    section: str
    name: str
    kind: Kind
    default: Any
    doc: str
    shown: str | None = None  # the default as the reference says it, where the value alone would mislead
    required: bool = False  # in a section that is written (a [distributed] table names its rendezvous)

    @property
    def where(self) -> str:
        return f"{self.section}.{self.name}" if self.section else self.name


def key(kind: Kind, default: Any, doc: str, *, at: str | None = None, shown: str | None = None,
        required: bool = False, init_default: bool = True) -> Any:
    """A dataclass field that is a configuration key: in its class's SECTION under the field's name, or ``at``
    ("section.name", "name" at the top level). ``init_default``: False where the dataclass wants it given."""
    section, _, name = at.rpartition(".") if at else (None, "", None)
    declared = Key(section, name, kind, default, doc, shown, required)  # type: ignore[arg-type]
    if not init_default:
        return dataclasses.field(metadata={"key": declared})
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"key": declared})
    return dataclasses.field(default=default, metadata={"key": declared})


def table(cls: type, default_none: bool = False) -> Any:
    """A dataclass field holding a section's dataclass (None until its section is written, with default_none)."""
    if default_none:
        return dataclasses.field(default=None, metadata={"table": cls})
    return dataclasses.field(default_factory=cls, metadata={"table": cls})


def _placed(cls: type, f: dataclasses.Field) -> Key:
    declared = f.metadata["key"]
    return declared if declared.name else dataclasses.replace(declared, section=getattr(cls, "SECTION", ""),
                                                              name=f.name)


def declared_keys(cls: type) -> list[Key]:
    """Every key ``cls`` and the sections it holds declare, in the order of their fields."""
    found = []
    for f in dataclasses.fields(cls):
        if "key" in f.metadata:
            found.append(_placed(cls, f))
        elif "table" in f.metadata:
            found.extend(declared_keys(f.metadata["table"]))
    return found


def read_keys(raw: dict[str, Any], keys: list[Key], reader: Reader) -> dict[str, Any]:
    """The values of the keys ``raw`` gives, read by their kinds and keyed by ``Key.where``; unknown keys refused."""
    sections = list(dict.fromkeys(k.section for k in keys))
    reader.table("", raw, {k.name for k in keys if not k.section} | set(sections) - {""})
    values: dict[str, Any] = {}
    for section in sections:
        given = raw if not section else raw.get(section, {})
        ours = [k for k in keys if k.section == section]
        if section:
            reader.table(section, given, {k.name for k in ours})
        for k in ours:
            if k.name in given:
                values[k.where] = k.kind.read(given[k.name], k.where, reader)
            elif k.required and given:
                reader.missing(k.where, k.kind.expected, f"a [{section}] table")
    return values


def build(cls: type, values: dict[str, Any], **given: Any) -> Any:
    """``cls`` from the values read: a key not written takes the dataclass's default (or its declared one)."""
    for f in dataclasses.fields(cls):
        if f.name in given or not f.init:
            continue
        if "table" in f.metadata and f.default is not None:
            given[f.name] = build(f.metadata["table"], values)
        elif "key" in f.metadata:
            declared = _placed(cls, f)
            if declared.where in values:
                given[f.name] = values[declared.where]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                given[f.name] = declared.default
    return cls(**given)
