"""What a source file imports, read with ast from the file itself: the floors' test (tests/test_floors.py), the
decision core's (tests/decision/test_decision_imports.py) and the worker's (tests/worker/test_worker_imports.py)."""

import ast
from pathlib import Path

from tests.helpers import ROOT


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, inside a function) for every import in ``path``; ``from worker import ddp`` is worker.distributed.ddp
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
            found += [(f"{node.module}.{a.name}" if (package / f"{a.name}.py").is_file()
                       or (package / a.name / "__init__.py").is_file() else node.module,
                       id(node) in in_function) for a in node.names]
    return found
