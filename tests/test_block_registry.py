"""The block registry is the one place that names a block kind: outside olmo_patches/blocks/ (and
the modules of nn/ it builds), no library module or script compares model.block with a kind's
name."""

import ast

from .conftest import REPO

NAMES = {
    "baseline",
    "hourglass",
    "variable_width",
}  # the papers' kinds, written here (not read from the registry)
# The stand-alone modeling file shipped inside every Hugging Face export names its own FFN forms.
OWN_FORMAT = {"olmo_patches/export/modeling_hourglass_olmo.py"}


def _comparisons_with_a_kind(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [
                v
                for o in operands
                for v in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])
                if isinstance(v, ast.Constant) and v.value in NAMES
            ]
            if names and "block" in ast.unparse(
                node
            ):  # a kind's name against model.block (not a family or an expert kind)
                yield node.lineno


def test_no_module_outside_blocks_compares_with_a_block_name():
    files = [
        *sorted((REPO / "olmo_patches").rglob("*.py")),
        *sorted((REPO / "scripts").glob("*.py")),
    ]
    found = []
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("olmo_patches/blocks/", "olmo_patches/nn/")) or rel in OWN_FORMAT:
            continue
        found += [f"{rel}:{line}" for line in _comparisons_with_a_kind(path)]
    assert not found, "ask the block kind (olmo_patches/blocks/) instead: " + ", ".join(found)


def test_the_check_finds_a_comparison(tmp_path):
    """The check itself can fail: it finds both spellings the library used."""
    f = tmp_path / "m.py"
    f.write_text(
        'if m.block == "hourglass":\n    pass\nx = m.get("block") in ("baseline", "x")\n'
        'y = e.experts == "hourglass"\n'
    )
    assert list(_comparisons_with_a_kind(f)) == [1, 3]  # not line 4: an expert kind


def test_head_dims_without_a_model_config_match_the_built_config():
    """The launch reads every layer's head size off the spec (model.head_dims, from the kind's
    widths), without building OLMo-core's config: the same sizes as the built config's attention,
    for every shipped config."""
    from olmo_patches.config import load_spec
    from olmo_patches.nn.attention import head_dims

    paths = [p for p in sorted((REPO / "configs").rglob("*.yaml")) if not p.name.startswith("base")]
    assert len(paths) > 100
    for path in paths:
        spec = load_spec(path)
        assert spec.model.head_dims == head_dims(spec.model_config()), path
