"""docs/kernel_messages.md is written from the catalogue: a pattern added, changed or removed fails here until the
page is written again."""

from supervisor.kernel.catalogue import BUILTIN_PATTERNS
from supervisor.kernel.messages_reference import COMMAND, REFERENCE, render


def test_the_committed_page_is_the_one_the_catalogue_writes():
    assert REFERENCE.read_text() == render(), f"docs/kernel_messages.md is stale: run `{COMMAND}` and commit it"


def test_every_builtin_pattern_has_its_row():
    page = render()
    for p in BUILTIN_PATTERNS:
        assert f"| `{p.name}` | {p.kind} | " in page, p.name
