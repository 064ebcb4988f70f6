"""The patterns a configuration may hold, checked: ``[kernel_log] patterns`` and ``[progress] regex``.

Pure (strings in, compiled patterns or a one-line problem out), so the configuration checks them on load without
importing the sources that use them: kernel/catalogue.py (the catalogue) and attempt/progress_lines.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.vocabulary import KernelKind

KINDS = tuple(kind.value for kind in KernelKind)
IGNORE = "ignore"
ENTRY_KINDS = KINDS + (IGNORE,)
REGEX_GROUPS = ("epoch", "epochs", "batch", "batches", "loss")  # the named groups a [progress] regex may have


@dataclass(frozen=True)
class CatalogueEntry:
    """One entry of a catalogue of known messages: its name and the pattern that finds it. Each catalogue adds what
    its entries mean: a kernel line's kind (``Pattern``), an output line's remedy (``signatures.Signature``), a
    native frame's cause and cure (``stack_reading.NativeSignature``)."""
    name: str
    regex: re.Pattern[str]

    def finds(self, text: str) -> bool:
        return self.regex.search(text) is not None


@dataclass(frozen=True)
class Pattern(CatalogueEntry):
    kind: str
    origin: str  # where the message format comes from (documentation, and the table in docs/design.md)


class CatalogueError(ValueError):
    """A user pattern the catalogue refuses; the message is one line: where, which entry, the fix."""


def _compile(name: str, regex: str, kind: str, where: str) -> re.Pattern[str]:
    if not isinstance(name, str) or not name.strip():
        raise CatalogueError(f"{where}: a pattern needs a non-empty name; give it one")
    if not isinstance(regex, str) or not regex:
        raise CatalogueError(f"{where} ({name!r}): the regex must be a non-empty string")
    if kind not in ENTRY_KINDS:
        raise CatalogueError(
            f"{where} ({name!r}): kind {kind!r} is not one of {', '.join(ENTRY_KINDS)}; use one of those"
        )
    try:
        compiled = re.compile(regex)
    except re.error as exc:
        raise CatalogueError(f"{where} ({name!r}): bad regular expression: {exc}; fix the regex") from None
    return compiled


def validate_patterns(entries: object, where: str = "[kernel_log] patterns") -> tuple[Pattern, ...]:
    """User patterns from the configuration, checked; raises CatalogueError with a one-line message.

    ``entries`` is a list whose items are either ``[name, regex, kind]`` or a table
    ``{name = ..., regex = ..., kind = ...}``. ``where`` names the place in the configuration for errors
    (for example ``"/etc/yolo-train.toml: [kernel_log] patterns"``).
    """
    if entries is None:
        return ()
    if not isinstance(entries, (list, tuple)):
        raise CatalogueError(f"{where}: expected a list of [name, regex, kind] entries, got {type(entries).__name__}")
    patterns: list[Pattern] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if isinstance(entry, Mapping):
            unknown = set(entry) - {"name", "regex", "kind"}
            if unknown:
                raise CatalogueError(f"{at}: unknown key(s) {', '.join(sorted(unknown))}; use name, regex, kind")
            name, regex, kind = entry.get("name"), entry.get("regex"), entry.get("kind")
        elif isinstance(entry, (list, tuple)) and len(entry) == 3:
            name, regex, kind = entry
        else:
            raise CatalogueError(f"{at}: expected [name, regex, kind], got {entry!r}")
        compiled = _compile(name, regex, kind, at)
        if name in seen:
            raise CatalogueError(f"{at} ({name!r}): the name is used twice; give each pattern its own name")
        seen.add(name)
        patterns.append(Pattern(name, compiled, kind, f"user pattern ({where})"))
    return tuple(patterns)


def validate_regex(regex: str) -> str | None:
    """None when ``regex`` is a usable ``[progress] regex``, else the problem in one line."""
    try:
        compiled = re.compile(regex)
    except re.error as e:
        return f"does not compile: {e}"
    if not set(compiled.groupindex) & set(REGEX_GROUPS):
        return ("has none of the named groups " + ", ".join(REGEX_GROUPS)
                + r"; name what it captures, e.g. 'step (?P<batch>\d+)/(?P<batches>\d+)'")
    return None
