"""Loading a config is pure: the same spec on a login node and on a GPU node, with no model built
and no machine read. What depends on the machine is `launch.layout.resolve`'s
(tests/test_world_size.py, tests/test_presets.py)."""

import ast
import sys

import pytest
import torch

from olmo_patches.config import load_spec, spec_to_yaml
from olmo_patches.blocks.base import ModelSpec
from olmo_patches.launch.layout import Layout, resolve

from .conftest import REPO, run

BASES = ("base.yaml", "base-revised.yaml", "base-paper2.yaml")
SHIPPED = sorted(p for p in (REPO / "configs").rglob("*.yaml") if p.name not in BASES)


def _load_all(monkeypatch, cuda: bool) -> dict:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8 if cuda else 0)
    return {p: spec_to_yaml(load_spec(p)) for p in SHIPPED}


@pytest.mark.slow
def test_every_shipped_config_loads_the_same_with_and_without_cuda(monkeypatch):
    def no_build(self, vocab_size):
        raise AssertionError("loading a config built the model config")

    monkeypatch.setattr(ModelSpec, "build", no_build)
    assert len(SHIPPED) > 50
    without, with_cuda = _load_all(monkeypatch, False), _load_all(monkeypatch, True)
    assert without == with_cuda
    # nothing was resolved: the keys a preset fills are still null where the config left them
    assert "micro_batch_size: null" in without[REPO / "configs" / "1B" / "hourglass.yaml"]


@pytest.mark.slow
def test_loading_every_shipped_config_imports_no_torch():
    """A config is read and checked before torch is imported: a refusal takes a fraction of a
    second."""
    code = (
        "import sys; from pathlib import Path; from olmo_patches.config import load_spec\n"
        f"paths = [p for p in Path({str(REPO / 'configs')!r}).rglob('*.yaml') if p.name not in "
        f"{BASES!r}]\n"
        "[load_spec(p) for p in paths]\n"
        "print(len(paths), sorted(m for m in ('torch', 'olmo_core', 'numpy') if m in sys.modules))"
    )
    r = run([sys.executable, "-c", code])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(len(SHIPPED)), "[]"], r.stdout


def test_the_vocabulary_known_at_load_is_olmo_cores():
    """config/spec.py knows dolma2's size without importing OLMo-core; the model's vocabulary is
    OLMo-core's padded size, for dolma2 and the demo tokenizer alike."""
    from olmo_core.data import TokenizerConfig

    from olmo_patches.config import tokenizer_config, vocab_size

    for config in ("113M/hourglass.yaml", "demo/baseline.yaml", "paper2/200M/baseline.yaml"):
        spec = load_spec(REPO / "configs" / config)
        assert vocab_size(spec) == tokenizer_config(spec).padded_vocab_size(), config
    spec = load_spec(REPO / "configs" / "1B" / "baseline.yaml")
    assert vocab_size(spec) == TokenizerConfig.dolma2().padded_vocab_size() == 100352
    assert (
        spec.model.vocab_size is None
    )  # the padded size above is the one computed, not a config's


def test_resolve_fills_what_the_machine_decides_and_says_so():
    spec = load_spec(
        REPO / "configs" / "demo" / "baseline.yaml",
        ["train.global_batch_size=8", "train.micro_batch_size=null"],
    )
    assert spec.train.micro_batch_size is None
    resolve(spec, Layout.plan(2))
    assert (
        spec.train.micro_batch_size == 4
    )  # no card on CPU: the whole per-rank batch (8 / 2 ranks)
    assert spec.resolved["train.micro_batch_size"] == 4
    assert resolve(spec, Layout.plan(2)).train.micro_batch_size == 4  # idempotent


def test_shapes_is_pure_arithmetic():
    """shapes/ imports the standard library only: a shape search runs without torch."""
    for path in (REPO / "olmo_patches" / "shapes").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names, f"{path.name} imports {name}"


@pytest.mark.parametrize("config", ["demo/hourglass.yaml"])
def test_a_resolved_spec_keeps_where_each_key_was_set(config, tmp_path):
    """resolve's refusals name the file or the command line that set the key, as load_spec's do."""
    from olmo_patches.config import ConfigError

    spec = load_spec(REPO / "configs" / config, ["train.global_batch_size=9"])
    with pytest.raises(
        ConfigError,
        match=r"^command line: train.global_batch_size=9: is not divisible by the 2 ranks",
    ):
        resolve(spec, Layout.plan(2))


def test_extends_merges_then_interpolates():
    """demo/hourglass.yaml extends demo/baseline.yaml: its own keys over the base's, and the base's
    ``${run.name}`` in run.save_folder resolved after the merge, to the child's name."""
    spec = load_spec(REPO / "configs" / "demo" / "hourglass.yaml")
    assert spec.run.save_folder == "runs/demo/demo-hourglass"
    assert (spec.model.block, spec.model.K, spec.model.d_model) == ("hourglass", 8, 128)
