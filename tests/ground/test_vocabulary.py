"""One spelling for every label: the vocabulary's enums reach metrics, the dashboard and the docs, and the
life cycle is a table that refuses a wrong transition."""

import re
from pathlib import Path

import pytest

from supervisor.decision import core
from supervisor.vocabulary import (FINAL_STATES, HANG_PHASES, PHASE_LABELS, STARTUP_PHASE, KernelKind, Reason,
                                            State)
from supervisor.telemetry import metric_table as metrics
from supervisor.kernel.catalogue import BUILTIN
from worker.wire.contract import Phase

ROOT = Path(__file__).resolve().parents[2]


def test_metrics_export_every_member_of_the_vocabulary():
    assert set(metrics.STATES) == {s.value for s in State}
    assert set(metrics.RESTART_REASONS) == {r.value for r in Reason}
    assert set(metrics.KERNEL_EVENT_KINDS) == {k.value for k in KernelKind}
    assert set(metrics.PHASES) == {p.value for p in Phase} | {"none"}
    assert set(HANG_PHASES) == {"startup", "train", "val", "save", "ending", "done"}


def test_the_dashboard_names_and_colours_every_state_and_phase():
    pytest.importorskip("grafana_foundation_sdk")
    from dashboards import build

    assert build.STATES == tuple(s.value for s in State) and set(build.STATE_COLORS) == set(build.STATES)
    assert build.PHASES == PHASE_LABELS and set(build.PHASE_COLORS) == set(PHASE_LABELS)


def test_the_kernel_messages_table_is_the_catalogue():
    page = (ROOT / "docs" / "kernel_messages.md").read_text()
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| ([a-z_]+) \|", page, flags=re.M)
    assert rows == [(name, kind) for name, _regex, kind, _origin in BUILTIN]


def test_every_state_has_a_row_in_the_transition_table_and_a_wrong_move_raises(monkeypatch):
    from tests.helpers.driver import healthy

    assert set(core.TRANSITIONS) == set(State)
    for final in (State.SUCCEEDED, State.FAILED, State.STOPPED):
        assert core.TRANSITIONS[final] == {final}
    d = healthy()

    def jump_to_backoff(s, event, now):  # a handler that forgets the life cycle
        s.state = State.BACKOFF
        return []

    monkeypatch.setattr(core, "_dispatch", jump_to_backoff)
    with pytest.raises(core.TransitionError, match="healthy -> backoff on Tick"):
        core.decide(d.s, core.Tick(), core.Now(0.0, 0.0))


def test_a_label_and_a_list_of_choices_are_spelled_once_where_they_are_named():
    """The startup phase, the final states, the conv-fallback modes and the kernel log sources: each a name that the
    other modules import, never a copied string or list."""
    import ast

    lists = {frozenset({"auto", "on", "off"}): "worker/wire/contract.py",
             frozenset({"auto", "kmsg", "journal", "off"}): "supervisor/config.py",
             frozenset(s.value for s in FINAL_STATES): None}
    spelled = []
    for path in sorted([*(ROOT / "supervisor").rglob("*.py"), *(ROOT / "worker").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        named = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)}  # NAME = "startup"
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == STARTUP_PHASE and id(node) not in named:
                spelled.append((where, node.lineno, node.value))
            if isinstance(node, (ast.Tuple, ast.Set, ast.List)) and node.elts \
                    and all(isinstance(e, ast.Constant) for e in node.elts):
                values = frozenset(e.value for e in node.elts)
                if values in lists and lists[values] != where:
                    spelled.append((where, node.lineno, sorted(values)))
    assert spelled == []
