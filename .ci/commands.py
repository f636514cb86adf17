"""Every console command's main path once, as the installed package runs it (the entry points'
own function, olmo_patches.commands.run_command), in one process so that torch is imported once:
a 2-step tiny run trained, then what reads it. An import the install did not bring fails here.

    python .ci/commands.py core     # an install of the declared dependencies only
    python .ci/commands.py extras   # then the hf and eval extras: the commands that need them

Run from an empty folder outside the checkout (.ci/install_check): the configs are the wheel's.
"""

import shutil
import sys
import time
from pathlib import Path

import numpy as np

from olmo_patches.commands import COMMANDS, run_command
from olmo_patches.resources import data_path

TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "data.sequence_length=32",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "train.warmup_steps=1",
    "eval.interval=1000",
    "eval.max_batches=2",
    "run.log_interval=1",
    "train.max_steps=2",
    "run.save_folder=runs/demo-baseline",
]
BASELINE = "configs/demo/baseline.yaml"
# (command, arguments, exit code)
CORE = [
    ("train", [BASELINE, *TINY], 0),
    ("demo", [BASELINE, "--out", "demo", "--set", *TINY], 0),  # the run kept, its table
    ("count", ["configs/demo/hourglass.yaml"], 0),
    ("search", [BASELINE, "--top", "3"], 0),
    ("sweep", ["report", BASELINE, "--set", *TINY, "--out", "sweep"], 0),
    ("tables", ["runs", "--out", "tables"], 0),
    ("verify-checkpoints", ["runs/demo-baseline"], 0),
    ("config-table", ["table"], 0),  # two of the shipped configs
    ("tokenize", ["doc.txt", "--out", "tokens", "--config", BASELINE, "--workers", "1"], 0),
    ("coordcheck", [BASELINE, *TINY[:3], "--steps", "2", "--axes", "width", "--out", "cc"], 0),
    ("evaluate", ["runs/demo-baseline/step2", "--out", "eval.json"], 0),
    ("bench", ["--variants", "baseline", "--steps", "1", "--repeats", "1", "--compile", "off"], 0),
    (
        "data-order",
        ["indices", "--paths-file", "order.txt", "--seq-len", "16", "--out", "o.npy"],
        0,
    ),
    ("gpu-check", ["--rehearse", "--out", "gpu_check"], 2),  # a checkout's: one line, exit 2
]
EXTRAS = [("export", ["runs/demo-baseline/step2", "hf"], 0)]


def main() -> None:
    commands = {"core": CORE, "extras": EXTRAS}[sys.argv[1]]
    if sys.argv[1] == "core":
        assert {c for c, _, _ in CORE + EXTRAS} == set(COMMANDS), "a console command left out"
        open("doc.txt", "w").write("A document to tokenize.\n")
        np.arange(4096, dtype=np.uint32).tofile("order.npy")
        open("order.txt", "w").write("order.npy\n")
        for config in ("base.yaml", "113M/baseline.yaml", "113M/hourglass.yaml"):
            Path("table", config).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(data_path("configs", config), Path("table", config))
    for name, args, expected in commands:
        start, code = time.perf_counter(), 0
        try:
            run_command(name, args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        seconds = time.perf_counter() - start
        print(f"hourglass-{name}: exit {code} in {seconds:.1f} s", file=sys.stderr)
        if code != expected:
            sys.exit(f"hourglass-{name} {' '.join(args)}: exit {code}, not {expected}")


if __name__ == "__main__":
    main()
