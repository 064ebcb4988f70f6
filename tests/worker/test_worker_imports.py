"""The worker's modules import each other at their top and in one direction (no circle hidden in function bodies),
and the two sides import of each other what worker/wire/contract.py's docstring says."""

from pathlib import Path

from tests.helpers.source_imports import ROOT, SUPERVISOR_USES, imports, module_name


def worker_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / "worker").rglob("*.py"))}


def test_no_worker_module_imports_another_inside_a_function():
    late = [(name, imported) for name, path in worker_modules().items()
            for imported, inside in imports(path) if inside and imported.startswith("worker")]
    assert late == []


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


def test_each_side_imports_of_the_other_what_the_contract_says():
    worker_side = {m for path in (ROOT / "worker").rglob("*.py") for m, _ in imports(path)}
    assert not {m for m in worker_side if m.split(".")[0] == "supervisor"}
    supervisor_side = {m for path in (ROOT / "supervisor").rglob("*.py") for m, _ in imports(path)
                       if m.split(".")[0] == "worker"}
    assert supervisor_side <= SUPERVISOR_USES
