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


# Each library file's role, as the layers are counted (README, "Lines by role"): the papers' modules
# and their wiring into OLMo-core; the data and evaluation sets; and the harness (launch, a run's
# life, reports, the command line, validation, the benchmark and checks): every file not listed
# as the papers' or data, and those in HARNESS. A prefix ending in "/" stands for a folder. A kind's
# own checks are counted with its kind (one file a kind).
HARNESS = ("blocks/checks.py",)  # validation, though beside the keys it checks
PAPERS = (
    "shapes/",
    "nn/",
    "blocks/",
    "optim/",
    "export/",
    "config/spec.py",  # the recipe's keys (OLMo-2 Stage 1, the papers' runs)
    "config/shape_config.py",  # a solved hourglass shape as a config
    "config/paper_sweeps.py",  # the papers' sweeps
    "config/__init__.py",
    "train/experiment.py",  # the spec -> OLMo-core's model, data, train module, Trainer
    "train/optimizer.py",  # AdamW's groups (muP) and the schedule
    "train/sources.py",  # the token files and the mixture
    "train/batch_trace.py",  # the data order, recorded
    "train/__init__.py",
    "report/counts.py",  # the papers' parameter counts
)
DATA = ("data/", "eval/")
HARNESS_AIM = 0.45  # of the library's lines
HARNESS_CAP = 0.49  # what it may not grow past (README's figure: 48.7%)


def _role(rel: str) -> str:
    def listed(prefixes):
        return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)

    if listed(HARNESS):
        return "harness"
    return "papers" if listed(PAPERS) else "data" if listed(DATA) else "harness"


def test_lines_by_role():
    """Every line of olmo_patches/**/*.py (blank lines, comments and docstrings included) counted by
    its file's role; `pytest -s` prints the table. The harness may not grow past HARNESS_CAP."""
    lines = {"papers": 0, "data": 0, "harness": 0}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        lines[_role(rel)] += len(path.read_text().splitlines())
    total = sum(lines.values())
    for role, n in lines.items():
        print(f"{role:8s} {n:6d} lines {n / total:6.1%}")
    listed = [p for p in HARNESS + PAPERS + DATA if not (PACKAGE / p).exists()]
    assert not listed, f"listed but not in the package: {listed}"
    assert lines["harness"] / total <= HARNESS_CAP, (lines, f"aim: {HARNESS_AIM:.0%}")
