"""The house's floors, read from the modules a fresh interpreter actually loads: every supervisor module imports
only its own wing and the wings on lower floors (at its top or inside a function alike): nothing upward, nothing
sideways. Each wing's ``__init__.py`` says the same in words; this test is the rule."""

import json
import os
import subprocess
import sys
import textwrap

from tests.helpers.source_imports import ROOT, imports

# wing -> floor; a module belongs to the longest wing that prefixes its name.
FLOORS = {
    "supervisor.vocabulary": 0, "supervisor.exit_codes": 0,  # the ground: stdlib and the wire contract only
    "supervisor.config": 1, "supervisor.config_keys": 1, "supervisor.patterns": 1, "supervisor.ultralytics_args": 1,
    "supervisor.config_reference": 1,
    "supervisor.decision": 2,  # pure rules: no I/O
    "supervisor.host": 3,  # /proc, sysfs, NVML, py-spy, signals: this machine
    "supervisor.state": 4,  # the state directory
    "supervisor.attempt": 5, "supervisor.kernel": 5, "supervisor.telemetry": 5,
    "supervisor.verbs": 6, "supervisor.agent": 6,
    "supervisor.cli": 7, "supervisor.__main__": 8,
}
WINGS = {"supervisor.config_keys": "config", "supervisor.patterns": "config", "supervisor.ultralytics_args": "config",
         "supervisor.config_reference": "config", "supervisor.config": "config",
         "supervisor.vocabulary": "ground", "supervisor.exit_codes": "ground"}


def wing_of(module: str) -> str:
    owner = max((w for w in FLOORS if module == w or module.startswith(w + ".")), key=len)
    return WINGS.get(owner, owner)


def floor_of(module: str) -> int:
    return FLOORS[max((w for w in FLOORS if module == w or module.startswith(w + ".")), key=len)]


def loaded_modules() -> list[str]:
    """Every supervisor module, as a fresh interpreter holds them after importing each one of the package."""
    program = textwrap.dedent("""
        import importlib, json, pkgutil, sys
        import supervisor
        for info in pkgutil.walk_packages(supervisor.__path__, "supervisor."):
            if info.name != "supervisor.__main__":
                importlib.import_module(info.name)
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("supervisor."))))
    """)
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    return json.loads(out)


def source_of(module: str):
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def test_every_module_stands_on_a_known_floor():
    modules = loaded_modules()
    assert "supervisor.decision.core" in modules and "supervisor.agent" in modules
    unknown = [m for m in modules if not any(m == w or m.startswith(w + ".") for w in FLOORS)]
    assert unknown == []


def crossings(module: str, imported: list[str]) -> list[str]:
    """The imports of ``module`` that reach another wing on its own floor or above."""
    return [f"{module} (floor {floor_of(module)}) -> {i} (floor {floor_of(i)})" for i in imported
            if i.startswith("supervisor.") and wing_of(i) != wing_of(module) and floor_of(i) >= floor_of(module)]


def test_nothing_imports_upward_or_sideways():
    wrong = [c for m in loaded_modules() for c in crossings(m, [i for i, _ in imports(source_of(m))])]
    assert wrong == []


def test_the_rule_names_an_upward_and_a_sideways_import():
    assert crossings("supervisor.decision.core", ["supervisor.agent", "supervisor.decision.model.state"]) == [
        "supervisor.decision.core (floor 2) -> supervisor.agent (floor 6)"]
    assert len(crossings("supervisor.kernel.reader", ["supervisor.telemetry.metrics", "supervisor.host.stacks"])) == 1
    assert crossings("supervisor.patterns", ["supervisor.config", "supervisor.vocabulary"]) == []


def test_the_ground_floor_imports_nothing_of_the_project_but_the_wire_contract():
    ground = [m for m in loaded_modules() if wing_of(m) == "ground"]
    assert ground == ["supervisor.exit_codes", "supervisor.vocabulary"]
    found = {i for m in ground for i, _ in imports(source_of(m)) if i.split(".")[0] in ("supervisor", "worker")}
    assert found == {"worker.wire.contract"}


def test_the_supervisor_imports_of_the_worker_only_its_wire():
    found = {(m, i) for m in loaded_modules() for i, _ in imports(source_of(m))
             if i.split(".")[0] == "worker"}
    assert found and {i for _, i in found if not i.startswith("worker.wire.")} == set(), sorted(found)


# decision/'s sub-wings, lowest first: a module of one imports only its own sub-wing and those below it; the handlers
# on top (decision/'s own modules) import any of them, and no module of the decision imports the package's face.
DECISION_FLOORS = {"supervisor.decision.model": 1, "supervisor.decision.stall": 2, "supervisor.decision.learning": 3,
                   "supervisor.decision.recovery": 4, "supervisor.decision": 5}


def sub_wing_of(module: str) -> str:
    return max((w for w in DECISION_FLOORS if module == w or module.startswith(w + ".")), key=len)


def decision_crossings(module: str, imported: list[str]) -> list[str]:
    """The imports of decision module ``module`` that reach the face, or another sub-wing on its own floor or above."""
    wing = sub_wing_of(module)
    return [f"{module} -> {i}" for i in imported if i.startswith("supervisor.decision") and (
        i == "supervisor.decision" or sub_wing_of(i) != wing
        and DECISION_FLOORS[sub_wing_of(i)] >= DECISION_FLOORS[wing])]


def test_the_decision_sub_wings_import_nothing_upward_or_sideways():
    modules = [m for m in loaded_modules() if m.startswith("supervisor.decision.")]
    assert {sub_wing_of(m) for m in modules} == set(DECISION_FLOORS)
    wrong = [c for m in modules for c in decision_crossings(m, [i for i, _ in imports(source_of(m))])]
    assert wrong == []


def test_the_sub_wing_rule_names_an_upward_import_and_one_through_the_face():
    assert decision_crossings("supervisor.decision.stall.watchdog", [
        "supervisor.decision.recovery.in_place", "supervisor.decision.model.state", "supervisor.decision.stall.witness",
        "supervisor.decision"]) == ["supervisor.decision.stall.watchdog -> supervisor.decision.recovery.in_place",
                                    "supervisor.decision.stall.watchdog -> supervisor.decision"]
    assert decision_crossings("supervisor.decision.core", ["supervisor.decision.recovery",
                                                           "supervisor.decision.heartbeats"]) == []
