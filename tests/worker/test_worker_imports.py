"""The worker's modules import each other at their top and in one direction (no circle hidden in function bodies),
and the two sides import of each other what worker/contract.py's docstring says."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What the supervisor may import of worker/ (worker/contract.py's docstring names each and why).
SUPERVISOR_USES = {"worker.contract", "worker.heartbeat", "worker.faults", "worker.durable_file",
                   "worker.patches.miopen_db"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, inside a function) for every import in ``path``; ``from worker import ddp`` is worker.ddp
    (a module of a package is named whole)."""
    tree = ast.parse(path.read_text())
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if n is not f}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in in_function) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            package = ROOT.joinpath(*node.module.split("."))
            found += [(f"{node.module}.{a.name}" if (package / f"{a.name}.py").is_file() else node.module,
                       id(node) in in_function) for a in node.names]
    return found


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
