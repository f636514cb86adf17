"""The embedded default job end to end, on tiny variants: training (scripts/demo.py's loop), then the
comparison's table, summary.json and loss curves."""

import json

import pytest

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.report.demo import compare
from olmo_patches.train import train

from .conftest import REPO, tiny_overrides


def test_demo_trains_each_variant_and_writes_the_summary(tmp_path, demo_corpus):
    specs = [
        load_and_resolve(
            REPO / "configs" / "demo" / f"{name}.yaml", tiny_overrides(tmp_path / name, "train.max_steps=3", block=block)
        )
        for name, block in (("baseline", "baseline"), ("hourglass", "hourglass"))
    ]
    for spec in specs:
        train(spec)
    results = compare(specs, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert list(summary) == ["demo-baseline", "demo-hourglass"]
    for r in results:
        entry = summary[r.name]
        for key in ("val_loss", "val_ppl", "tokens_per_second", "non_embedding_params"):
            assert key in entry
        assert entry["val_ppl"] == pytest.approx(2.718281828 ** entry["val_loss"], rel=1e-4)
        assert entry["tokens_per_second"] > 0 and entry["train_tokens"] == 3 * 4 * 32
        # The first validation is at initialisation: near ln(vocab) for a fresh model.
        assert entry["first_val_loss"] == pytest.approx(8.3, abs=0.5)
    # tiny_overrides' hourglass (K=2, d_h=16) and baseline (hidden 128) differ; both are counted exactly.
    assert summary["demo-baseline"]["non_embedding_params"] == 2 * (4 * 32 * 32 + 3 * 32 * 128)
    assert summary["demo-hourglass"]["non_embedding_params"] == 2 * (4 * 32 * 32 + 3 * 2 * 32 * 16)
    png = (tmp_path / "out" / "loss_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
