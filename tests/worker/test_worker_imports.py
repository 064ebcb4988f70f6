"""worker/'s law (worker/__init__.py): each sub-wing imports only its own and those under it, at a module's top;
the supervisor imports the wire alone, the worker nothing of the supervisor; what users import stays where the README
says."""

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.source_imports import ROOT, imports, module_name

# worker/'s sub-wings, the ground first (worker/__init__.py lists them top first).
WINGS = ["worker.wire", "worker.wait_chain", "worker.witness", "worker.heartbeat", "worker.patches", "worker.checkpoints", "worker.loading",
         "worker.startup", "worker.supervision", "worker.standby", "worker.distributed", "worker.training",
         "worker.__main__"]


def worker_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / "worker").rglob("*.py"))}


def floor_of(module: str) -> int:
    return next(i for i, wing in enumerate(WINGS) if module == wing or module.startswith(wing + "."))


def imports_up(module: str, imported: list[str]) -> list[str]:
    """The imports of ``module`` that reach a worker wing above its own."""
    return [f"{module} -> {i}" for i in imported
            if i.startswith("worker.") and floor_of(i) > floor_of(module)]


def test_every_worker_module_stands_in_a_wing_of_the_law():
    assert [m for m in worker_modules() if m != "worker" and not any(
        m == w or m.startswith(w + ".") for w in WINGS)] == []


def test_no_worker_module_imports_another_inside_a_function():
    late = [(name, imported) for name, path in worker_modules().items()
            for imported, inside in imports(path) if inside and imported.startswith("worker")]
    assert late == []


def test_no_worker_module_imports_a_wing_above_its_own():
    wrong = [c for name, path in worker_modules().items() if name != "worker"
             for c in imports_up(name, [i for i, _ in imports(path)])]
    assert wrong == []


def test_the_rule_names_an_import_up():
    assert imports_up("worker.wire.contract", ["worker.heartbeat", "worker.wire.commands"]) == [
        "worker.wire.contract -> worker.heartbeat"]
    assert imports_up("worker.training.train", ["worker.wire.contract", "worker.standby.ready"]) == []


def test_the_worker_modules_import_each_other_without_a_circle():
    modules = worker_modules()
    graph = {name: {m for m, _ in imports(path) if m in modules and m != name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join(path + (name,))
        if name not in done:
            for imported in sorted(graph[name]):
                visit(imported, path + (name,))
            done.add(name)

    for name in graph:
        visit(name, ())


def test_the_supervisor_imports_the_wire_alone_and_the_worker_nothing_of_the_supervisor():
    worker_side = {m for path in (ROOT / "worker").rglob("*.py") for m, _ in imports(path)}
    assert not {m for m in worker_side if m.split(".")[0] == "supervisor"}
    supervisor_side = {m for path in (ROOT / "supervisor").rglob("*.py") for m, _ in imports(path)
                       if m.split(".")[0] == "worker"}
    assert supervisor_side and {m for m in supervisor_side if not m.startswith("worker.wire.")} == set()


def test_what_the_readme_and_the_examples_import_of_the_worker_imports_in_a_fresh_interpreter():
    texts = [ROOT / "README.md", *sorted((ROOT / "examples").rglob("*.py")), *sorted((ROOT / "examples").rglob("*.md"))]
    lines = sorted({m[0] for path in texts for m in re.finditer(r"^\s*from worker[\w.]* import [\w, ]+$",
                                                               path.read_text(), re.M)})
    assert "from worker.heartbeat import Heartbeat" in [line.strip() for line in lines]
    program = "\n".join(line.strip() for line in lines) + "\nassert Heartbeat.from_env().enabled is False\n"
    subprocess.run([sys.executable, "-c", program], cwd=ROOT, check=True, env={"PYTHONPATH": str(ROOT)})
