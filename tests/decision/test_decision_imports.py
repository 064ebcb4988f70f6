"""The decision core's modules import each other at their top and in one direction, and nothing of the shell: a
reader of one module knows what it may touch, and the core stays pure (no I/O, no outputs, no sources): not by its
own imports nor through those of the configuration it reads, as a fresh interpreter's modules show."""

import json
import os
import subprocess
import sys
import textwrap
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from tests.helpers.source_imports import ROOT, imports, module_name

SHELL = ("supervisor.agent", "supervisor.attempt", "supervisor.host", "supervisor.kernel", "supervisor.state",
         "supervisor.telemetry", "supervisor.verbs", "supervisor.cli")


def decision_modules() -> dict[str, Path]:
    """Every module of the decision but its face (the package's ``__init__``, which hands the shell its names)."""
    face = ROOT / "supervisor" / "decision" / "__init__.py"
    return {module_name(p): p for p in sorted((ROOT / "supervisor" / "decision").rglob("*.py")) if p != face}


def test_the_decision_modules_import_each_other_at_their_top_without_a_circle():
    modules = decision_modules()
    assert {"supervisor.decision.core", "supervisor.decision.model.state",
            "supervisor.decision.recovery.stopping"} <= set(modules)
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


def loaded_by(statement: str) -> tuple[set[str], list[str]]:
    """The modules of this project a fresh interpreter holds after ``statement``, and the paths it then opened or
    listed while building the default ladder (sys.audit's open and os.scandir/os.listdir events)."""
    program = textwrap.dedent(f"""
        import json, sys
        {statement}
        from supervisor.decision.model.ladder import build_ladder
        touched = []
        sys.addaudithook(lambda event, args: touched.append(str(args[0]))
                         if event in ("open", "os.scandir", "os.listdir") else None)
        build_ladder(None, 8)
        build_ladder(None, 8, rocm=True, cuda=True)
        print(json.dumps([sorted(m for m in sys.modules if m.split(".")[0] in ("supervisor", "worker")), touched]))
    """)
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    modules, touched = json.loads(out)
    return set(modules), touched


def test_importing_the_core_loads_nothing_of_the_shell_and_its_ladder_opens_no_file():
    modules, touched = loaded_by("import supervisor.decision.core")
    assert "supervisor.decision.core" in modules and "supervisor.config" in modules
    assert sorted(m for m in modules if m.startswith(SHELL)) == []  # not through config either
    assert touched == []  # no /proc/driver/nvidia, no torch/version.py: the build is the shell's to read


def test_the_configuration_is_a_leaf_of_the_shell():
    modules, _ = loaded_by("import supervisor.config")
    assert sorted(m for m in modules if m.startswith(SHELL)) == []
