"""The package's layout: every import points down the layers.

The layers are written here, not read from the package: a module that starts importing upward (or a
new folder that is not placed) fails this test.
"""

import ast
import sys
from pathlib import Path


from .conftest import REPO

PACKAGE = REPO / "olmo_patches"

# What each part of the package may import from the package (besides itself).
BASE = {"resources", "shapes", "nn", "blocks", "optim", "data", "eval"}
ALLOWED = {
    "shapes": set(),
    "nn": {"shapes"},
    "blocks": {"shapes", "nn"},
    "optim": set(),
    "data": {"resources"},
    "eval": set(),
    "resources": set(),
    "config": BASE,
    "launch": BASE | {"config"},
    "train": BASE | {"config", "launch"},
    "report": BASE | {"config", "launch", "train"},
    "export": BASE | {"config", "launch", "train"},
    "cli": {"report", "config", "launch", "resources"},
    "commands": {"resources"},
    "__main__": {"commands"},
    "__init__": set(),
}
# Third-party imports the patch layer may use: it is a plug-in for OLMo-core, nothing more.
NN_THIRD_PARTY = {
    "torch",
    "olmo_core",
    "torchao",
}  # torchao: OLMo-core's float8 backend (olmo_core.float8), imported lazily


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _imports(name: str, path: Path):
    """(absolute module, is_from_package) of every import in the file, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                # `from . import x` / `from .. import x`: each x may be a module
                yield from (
                    (f"{target}.{a.name}" for a in node.names) if node.module is None else (target,)
                )
            else:
                yield node.module or ""


def test_every_import_points_down():
    wrong = []
    for name, path in _modules():
        part = _part(name)
        assert part in ALLOWED, (
            f"{path}: a new part of the package; place it in the layers (README, ALLOWED here)"
        )
        for target in _imports(name, path):
            if target.split(".")[0] != "olmo_patches" or target == "olmo_patches":
                continue
            other = _part(target)
            if other != part and other not in ALLOWED[part]:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_modules():
    names = dict(_modules())
    graph = {}
    for name, path in names.items():
        deps = set()
        for target in _imports(name, path):
            while target and target not in names:  # `from .x import Class` -> module x
                target = target.rpartition(".")[0]
            if target and target != name and target in names:
                deps.add(target)
        graph[name] = deps
    cycles, done = [], set()

    def visit(n, path):
        for m in graph[n]:
            if m in path:
                cycles.append(path[path.index(m) :] + [m])
            elif m not in done:
                visit(m, path + [m])
        done.add(n)

    for n in graph:
        if n not in done:
            visit(n, [n])
    assert not cycles, cycles


def test_the_patch_layer_imports_only_torch_and_olmo_core():
    third_party = set()
    for name, path in _modules():
        if _part(name) not in ("nn", "optim"):
            continue
        for target in _imports(name, path):
            top = target.split(".")[0]
            if top and top not in sys.stdlib_module_names and top != "olmo_patches":
                third_party.add(top)
    assert third_party <= NN_THIRD_PARTY, third_party


def test_scripts_only_call_the_library():
    """A script parses arguments and calls olmo_patches; model, data and training code lives
    there."""
    for script in sorted((REPO / "scripts").glob("*.py")):
        tree = ast.parse(script.read_text())
        tops = {
            (a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names
        }
        assert "olmo_core" not in tops, (
            f"{script.name} imports OLMo-core directly: put that in the library"
        )
        statements = sum(
            isinstance(n, ast.stmt) for n in ast.walk(tree)
        )  # the formatter's wraps aside
        assert statements < 130, f"{script.name}: a thin layer is short ({statements} statements)"


def test_no_function_over_60_lines():
    """The developers' guide: no function over 60 lines, from its ``def`` to its last line
    (docstring included), in the library, the scripts and the tests."""
    long = []
    for folder in ("olmo_patches", "scripts", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 60:
                        long.append(f"{path.relative_to(REPO)}: {node.name}, {lines} lines")
    assert not long, "\n".join(long)
