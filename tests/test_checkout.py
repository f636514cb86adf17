"""Every process a test starts runs this checkout's olmo_patches, not another install's."""

import ast
import sys
import uuid

from .conftest import REPO, run


def test_a_child_imports_this_checkout_and_sees_a_module_only_it_has():
    # A module that exists only in this checkout, for the length of the test.
    name = f"_checkout_marker_{uuid.uuid4().hex}"
    marker = REPO / "olmo_patches" / f"{name}.py"
    marker.write_text(f"CHECKOUT = {str(REPO)!r}\n")
    try:
        code = (
            f"import olmo_patches, olmo_patches.{name} as m; "
            "print(olmo_patches.__file__); print(m.CHECKOUT)"
        )
        r = run([sys.executable, "-c", code], timeout=60)
    finally:
        marker.unlink()
    assert r.returncode == 0, r.stderr
    package, checkout = r.stdout.split()
    assert package == str(REPO / "olmo_patches" / "__init__.py") and checkout == str(REPO)


def test_no_test_starts_a_process_but_through_conftest():
    """subprocess and os.exec*/spawn* appear only in conftest.py (child_env, run, run_script);
    torch.multiprocessing.spawn children inherit the parent's sys.path."""
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name in (
            "conftest.py",
            "_fake_slurm_bin.py",
        ):  # the fake srun and sbatch are programs that start their tasks, as Slurm's do
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "subprocess" not in names, f"{path.name}:{node.lineno} imports subprocess"
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                assert not node.attr.startswith(("exec", "spawn", "system", "popen")), (
                    f"{path.name}:{node.lineno} os.{node.attr}"
                )
