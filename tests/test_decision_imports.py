"""The decision core's modules import each other at their top and in one direction, and nothing of the shell: a
reader of one module knows what it may touch, and the core stays pure (no I/O, no outputs, no sources)."""

from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from test_worker_imports import ROOT, imports, module_name

SHELL = ("supervisor.agent", "supervisor.outputs", "supervisor.sources", "supervisor.cli")


def decision_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / "supervisor" / "decision").glob("*.py"))}


def test_the_decision_modules_import_each_other_at_their_top_without_a_circle():
    modules = decision_modules()
    assert {"supervisor.decision.core", "supervisor.decision.state", "supervisor.decision.stopping"} <= set(modules)
    graph = {name: {m for m, _ in imports(path) if m in modules and m != name} for name, path in modules.items()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        pytest.fail("import circle: " + " -> ".join(e.args[1]))
    assert [name for name, deps in graph.items() if "supervisor.decision.core" in deps] == []  # core wires the rest
    late = [(name, m) for name, path in modules.items() for m, inside in imports(path) if inside and m in modules]
    assert late == []


def test_the_decision_imports_nothing_of_the_shell():
    shell = [(name, m) for name, path in decision_modules().items() for m, _ in imports(path) if m.startswith(SHELL)]
    assert shell == []
