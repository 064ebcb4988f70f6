"""docs/configuration.md is written from the keys' declarations: a key added, changed or left undocumented fails here
until the reference is written again."""

from supervisor.config import KEYS, RUNG_SETTINGS
from supervisor.config_reference import COMMAND, REFERENCE, render
from worker.wire.contract import OPTION_TYPES


def test_the_committed_reference_is_the_one_the_keys_declare():
    assert REFERENCE.read_text() == render(), f"docs/configuration.md is stale: run `{COMMAND}` and commit it"


def test_every_key_and_rung_setting_has_its_row_under_its_section():
    reference = render()
    assert {k.name for k in RUNG_SETTINGS} == set(OPTION_TYPES)  # a rung setting the worker takes is declared
    for k in [*KEYS, *RUNG_SETTINGS]:
        heading = {"": "## Top level", "ladder.rungs": "### A rung's settings"}.get(k.section, f"## [{k.section}]")
        section = reference.split(heading + "\n", 1)[1].split("\n#", 1)[0]
        name = {"train": "[train]", "faults": "[[faults]]"}.get(k.where, k.name)
        takes = k.kind.expected.replace("|", "\\|")
        assert k.doc and f"| `{name}` | {takes} |" in section, k.where
