"""Post-hoc evaluation: OLMo-core's own evaluators (the in-loop ones) on one checkpoint of ours or
on a Hugging Face model, on CPU or one GPU; the metrics go to a ``metrics.jsonl`` that the tables
read.

- Ours (``RUN/stepN``): the run's ``config.yaml`` gives the model, the tokenizer and the evaluators
  exactly as :func:`eval_callbacks` builds them for training; tasks, validation sets and the tasks'
  sequence length can be overridden.
- Hugging Face (a local model folder, loaded offline): the tokenizer is the folder's
  ``tokenizer.json`` with the special ids of its ``config.json``; with ``config`` (a run's
  ``config.yaml``) the run's own tokenizer and validation data are used instead, so an exported
  model is evaluated exactly as its checkpoint.

The loop is OLMo-core's ``EvaluatorCallback.perform_eval`` without a Trainer: per batch
``get_labels``, a forward pass returning logits and the per-token CE loss
(``loss_reduction="none"``, as ``TransformerTrainModule.eval_batch``), ``update_metrics``; metric
names ``eval/{evaluator}/{metric}``.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from olmo_core.data import DataCollator, TokenizerConfig
from olmo_core.data.utils import get_labels
from olmo_core.eval import Evaluator
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.eval.lm_evaluator import LMEvaluator
from olmo_core.train import Duration, DurationUnit
from olmo_core.utils import move_to_device
from omegaconf import OmegaConf
from rich.progress import Progress

from olmo_core.train.checkpoint import Checkpointer

from ..config import ConfigError, ExperimentSpec, spec_to_yaml, vocab_size
from ..config.spec import check_fields, failer
from ..launch.layout import check_downstream_tasks, load_and_resolve
from ..eval.evaluators import DownstreamTaskEvaluator, downstream_evaluators
from .experiment import eval_callbacks
from .sources import DataSources, resolve_data
from ..launch.run_folder import METRICS_FILE
from .checkpoints import check_checkpoint_fits, checkpoint_step, latest_complete, load_model_state

log = logging.getLogger(__name__)

ITEMS = "items-step{step}.json"  # beside a run's metrics.jsonl: {task: each document's outcome}

__all__ = [
    "ITEMS",
    "from_checkpoint",
    "from_hf",
    "evaluate",
    "write_metrics",
    "EvalChoice",
    "default_out",
]

# (input_ids, labels) -> (logits, per-token CE loss)
Forward = Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


@dataclass
class EvalTarget:
    """A model ready to evaluate, with the evaluators of its tokenization."""

    name: str
    step: int
    forward: Forward
    evaluators: List[Evaluator]
    lm_duration: Duration = field(default_factory=lambda: Duration.epochs(1))
    config: Dict = field(default_factory=dict)  # written as config.yaml beside a new metrics file
    items: Dict[str, dict] = field(default_factory=dict)  # per task, each document's outcome


@dataclass
class EvalChoice:
    """What to evaluate; None keeps the run's own choice (for a Hugging Face model: none)."""

    tasks: Optional[List[str]] = None
    validation_sets: Optional[List[str]] = None  # v3-small-ppl-validation names; [] for none
    sequence_length: Optional[int] = None  # the downstream tasks' context
    limit: Optional[int] = None  # first N documents of each task
    batch_size: Optional[int] = (
        None  # sequences per downstream batch (default: the run's micro-batch, else 8)
    )


_fail = failer(lambda key: "command line")


def _olmo_forward(model) -> Forward:
    def forward(input_ids, labels):
        out = model(input_ids, labels=labels, ignore_index=-100, loss_reduction="none")
        return out.logits, out.ce_loss

    return forward


def _hf_forward(model) -> Forward:
    def forward(input_ids, labels):
        logits = model(input_ids=input_ids).logits.float()
        ce = F.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none"
        )
        return logits, ce.view_as(labels)

    return forward


def _evaluators(
    spec: ExperimentSpec, data: DataSources, choice: EvalChoice, device: torch.device
) -> Tuple[List[Evaluator], Duration]:
    """The run's evaluator callbacks (as in training, with ``choice``'s overrides) made into
    evaluators."""
    e = spec.eval
    if choice.tasks is not None:
        e.downstream_tasks = list(choice.tasks)
    if choice.sequence_length is not None:
        e.downstream_sequence_length = choice.sequence_length
    if choice.validation_sets is not None:
        e.validation_sets = list(choice.validation_sets)
        if choice.validation_sets and spec.data.tokenizer != "dolma2":
            _fail(
                "--validation-sets",
                " ".join(choice.validation_sets),
                "v3-small-ppl-validation is dolma2 tokens, this run's tokenizer is "
                f"{spec.data.tokenizer}",
            )
        # named sets replace the corpus's own split
        data = DataSources(data.tokenizer, data.train_paths, [], data.dtype)
    _check_choice(spec, choice)
    seq, micro = spec.data.sequence_length, spec.train.micro_batch_size or 8
    callbacks = eval_callbacks(spec, data)
    out: List[Evaluator] = []
    duration = Duration.epochs(1)
    if (lm := callbacks.get("lm_evaluator")) is not None:
        # In-loop batches (the run's micro-batch), so that eval.max_batches covers the same
        # instances.
        dataset = lm.eval_dataset.build()  # type: ignore[attr-defined]
        collator = DataCollator(pad_token_id=data.tokenizer.pad_token_id)
        out.append(
            LMEvaluator.from_numpy_dataset(
                dataset, name="lm", global_batch_size=micro * seq, collator=collator, device=device
            )
        )
        duration = lm.eval_duration  # type: ignore[attr-defined]
    if (ds := callbacks.get("downstream_evaluator")) is not None:
        batch_tokens = (choice.batch_size or micro) * max(seq, ds.sequence_length)  # type: ignore[attr-defined]
        try:  # a task none of whose documents fits the sequence length
            out += downstream_evaluators(
                ds.tasks,
                ds.tokenizer,
                ds.sequence_length,
                batch_tokens,  # type: ignore[attr-defined]
                device=device,
                limit=choice.limit,
            )
        except OLMoConfigurationError as e:
            raise ConfigError(" ".join(str(e).split())) from None
    return out, duration


_FLAGS = {
    "eval.downstream_tasks": "--tasks",
    "eval.validation_sets": "--validation-sets",
    "eval.downstream_sequence_length": "--sequence-length",
}


def _check_choice(spec: ExperimentSpec, choice: EvalChoice) -> None:
    """The eval section's checks (each number's domain, EvalSpec.validate's), reported against the
    command line's flags."""
    fail = lambda key, value, why: _fail(_FLAGS.get(key, key), value, why)  # noqa: E731
    check_fields(spec.eval, fail, "eval.")
    spec.eval.validate(fail)
    check_downstream_tasks(spec, fail)
    for key, value in (("--limit", choice.limit), ("--batch-size", choice.batch_size)):
        if value is not None and value < 1:
            _fail(key, value, "must be >= 1")


def _step_dir(checkpoint: Path, step: Optional[int]) -> Path:
    """A step folder, or a run folder with ``step`` (default: its latest complete checkpoint)."""
    if not checkpoint.is_dir():
        _fail(
            "CHECKPOINT",
            checkpoint,
            "a file, not a checkpoint or run folder" if checkpoint.exists() else "no such folder",
        )
    if step is not None and not Checkpointer.dir_is_checkpoint(checkpoint):
        path = checkpoint / f"step{step}"
        if not Checkpointer.dir_is_checkpoint(path):
            _fail("--step", step, f"no checkpoint {path}")
        return path
    if (latest := latest_complete(checkpoint)) is None:
        _fail("CHECKPOINT", checkpoint, "neither a checkpoint (stepN) nor a run folder with one")
    return Path(latest)  # type: ignore[arg-type]


def from_checkpoint(
    checkpoint: str | Path,
    choice: EvalChoice,
    *,
    step: Optional[int] = None,
    config: Optional[str | Path] = None,
    device: str = "cpu",
) -> EvalTarget:
    """One of our checkpoints (``RUN/stepN``, or ``RUN`` with ``step``), with the run's
    evaluators."""
    path = _step_dir(Path(checkpoint), step)
    config_path = Path(config) if config else path.parent / "config.yaml"
    if not config_path.is_file():
        _fail("--config", config_path, "no such file (the run's config.yaml)")
    spec = load_and_resolve(config_path)
    spec.train.device = device
    # before the model and the data: another model's checkpoint is refused by its metadata alone
    where = (
        f"command line: --config={config_path}: CHECKPOINT {path}"
        if config
        else f"command line: CHECKPOINT={path}"
    )
    check_checkpoint_fits(path, spec, where)
    model = spec.model.build(vocab_size=vocab_size(spec)).build(init_device="cpu")
    model.load_state_dict(load_model_state(path))
    data = resolve_data(spec)
    model.to(device).eval()
    evaluators, duration = _evaluators(spec, data, choice, torch.device(device))
    config = OmegaConf.to_container(OmegaConf.create(spec_to_yaml(spec)))
    return EvalTarget(
        spec.run.name, checkpoint_step(path), _olmo_forward(model), evaluators, duration, config
    )  # type: ignore[arg-type]


def _hf_tokenizer(model_dir: Path, hf_config) -> TokenizerConfig:
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        _fail(
            "--hf",
            model_dir,
            "no tokenizer.json in the model folder (export with --tokenizer, or pass --config)",
        )
    eos = hf_config.eos_token_id
    if eos is None:
        _fail("--hf", model_dir, "config.json has no eos_token_id")
    return TokenizerConfig(
        vocab_size=hf_config.vocab_size,
        eos_token_id=eos,
        pad_token_id=hf_config.pad_token_id if hf_config.pad_token_id is not None else eos,
        bos_token_id=hf_config.bos_token_id,
        identifier=str(tokenizer_file),
    )


def from_hf(
    model_dir: str | Path,
    choice: EvalChoice,
    *,
    config: Optional[str | Path] = None,
    name: Optional[str] = None,
    step: int = 0,
    validation_base_dir: str = "http://olmo-data.org",
    device: str = "cpu",
) -> EvalTarget:
    """A Hugging Face model folder, loaded with transformers offline (its own modeling code if it
    ships one)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        _fail("--hf", model_dir, "not a Hugging Face model folder (no config.json)")
    # our exports' modeling file
    remote = "auto_map" in json.loads((model_dir / "config.json").read_text())
    hf_config = AutoConfig.from_pretrained(
        model_dir, trust_remote_code=remote, local_files_only=True
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, trust_remote_code=remote, local_files_only=True, dtype=torch.float32
    )
    model.to(device).eval()
    # the run's tokenizer and validation data, as its checkpoint is evaluated
    if config is not None:
        spec = load_and_resolve(config)
        data = resolve_data(spec)
    else:
        spec = ExperimentSpec()
        spec.run.name = name or model_dir.name
        spec.data.sequence_length = hf_config.max_position_embeddings
        # named validation sets are dolma2 tokens
        spec.data.source, spec.data.tokenizer = ("numpy", "dolma2")
        spec.eval.validation_base_dir = validation_base_dir
        spec.eval.downstream_tasks = []
        data = DataSources(_hf_tokenizer(model_dir, hf_config), [], [])
    spec.run.name = name or spec.run.name
    evaluators, duration = _evaluators(spec, data, choice, torch.device(device))
    shape = {
        "d_model": hf_config.hidden_size,
        "n_layers": hf_config.num_hidden_layers,
        "n_heads": hf_config.num_attention_heads,
    }
    record = {
        "run": {"name": spec.run.name},
        "model": {"block": "hf", **shape},
        "hf": {"path": str(model_dir.resolve())},
    }
    return EvalTarget(spec.run.name, step, _hf_forward(model), evaluators, duration, record)


def evaluate(
    target: EvalTarget,
    *,
    device: str = "cpu",
    bf16: bool = False,
    progress: Optional[Progress] = None,
) -> Dict[str, float]:
    """Every evaluator of ``target`` once: {metric name: value}, named as in training. ``progress``
    (a rich Progress) gets one bar per evaluator: batches done of its total, instances, time
    left."""
    metrics: Dict[str, float] = {}
    autocast = torch.autocast(device, dtype=torch.bfloat16) if bf16 else nullcontext()
    for evaluator in target.evaluators:
        start = time.monotonic()
        evaluator.reset_metrics()
        steps = tokens = instances = 0
        total = evaluator.total_batches
        if isinstance(evaluator, LMEvaluator) and target.lm_duration.unit == DurationUnit.steps:
            total = min(total or target.lm_duration.value, target.lm_duration.value)
        name = getattr(evaluator, "display_name", evaluator.name)
        task = progress.add_task(name, total=total, instances=0) if progress is not None else None
        for batch in evaluator:
            steps += 1
            tokens += batch["input_ids"].numel()
            instances += batch["input_ids"].shape[0]
            if progress is not None and task is not None:
                progress.update(task, advance=1, instances=instances)
            batch = move_to_device(batch, torch.device(device))
            with torch.no_grad(), autocast:
                logits, ce_loss = target.forward(batch["input_ids"], get_labels(batch))
                evaluator.update_metrics(batch, ce_loss, logits)
            if isinstance(evaluator, LMEvaluator) and target.lm_duration.due(
                step=steps, tokens=tokens, epoch=1
            ):
                break
        for metric, value in evaluator.compute_metrics().items():
            metrics[f"eval/{evaluator.name}/{metric}"] = float(value)
        if isinstance(evaluator, DownstreamTaskEvaluator) and (items := evaluator.items()):
            target.items[evaluator.label] = items
        log.info(f"{name}: {steps} batches in {time.monotonic() - start:.1f} s")
    return metrics


def write_metrics(out: str | Path, target: EvalTarget, metrics: Dict[str, float]) -> Path:
    """One record (the target's step) to ``out``: a ``.json`` file (written: the name, the step and
    the metrics), a ``.jsonl`` file or a folder (its ``metrics.jsonl``), appended; the folder of a
    metrics file gets the target's ``config.yaml`` when it has none, so that ``make_tables.py``
    reads it as a run, and the downstream tasks' outcome per document (``ITEMS``: the sweep report's
    accuracy intervals over items and seeds)."""
    out = Path(out)
    record = {"step": target.step, **metrics}
    if out.suffix == ".json":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"name": target.name, **record}, indent=1) + "\n")
        return out
    if out.suffix != ".jsonl":
        out = out / METRICS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    if not (out.parent / "config.yaml").exists():
        (out.parent / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(target.config)))
    with out.open("a") as f:
        f.write(json.dumps(record) + "\n")
    if target.items:
        (out.parent / ITEMS.format(step=target.step)).write_text(json.dumps(target.items) + "\n")
    return out


def default_out(checkpoint: str | Path, step: Optional[int]) -> Path:
    """Our checkpoint's run folder's own metrics file."""
    return _step_dir(Path(checkpoint), step).parent / METRICS_FILE
