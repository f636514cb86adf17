"""How long a refusal takes: a bad config, a busy run folder, inputs that do not fit the run (a save
folder that is a file, a glob matching nothing, CUDA asked for without it, a micro-batch that does
not divide, a checkpoint of another model, a token id beyond the vocabulary, a data URL nothing
listens on, an impossible size, a tokenizer that is not JSON, a non-empty export folder, an
impossible search budget, an unknown device) and a bad argument to each script, each in a fresh
process (the median of --repeats), the one line it printed and its exit code.

    python benchmarks/bench_refusal.py [--repeats 5]

A refusal should come before any work and within seconds: what needs no model is checked before
torch is imported; a busy run folder is found once the training stack is loaded (the lock is taken
there). A case whose refusal is still missing shows what happens instead (its exit code, its last
line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))


TIMEOUT_S = 300  # a case still running then is cut off (exit "cut")


def _time(cmd: list[str], repeats: int, cwd: Path) -> tuple[float, int | str, int, str]:
    """The median seconds, the exit code, the lines printed (stderr and stdout) and the last on
    stderr (on stdout when stderr has none)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    seconds, code, out, err = [], None, "", ""
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            last = subprocess.run(
                cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
            )
            code, out, err = last.returncode, last.stdout, last.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = (
                "cut",
                (e.stdout or b"").decode(errors="replace"),
                (e.stderr or b"").decode(errors="replace"),
            )
        seconds.append(time.perf_counter() - start)
    lines = [line for line in (err or out).splitlines() if line.strip()]
    printed = sum(1 for line in (err + out).splitlines() if line.strip())
    return statistics.median(seconds), code, printed, lines[-1][:90] if lines else ""


def _artifacts(work: Path) -> dict[str, list[str]]:
    """Inputs that do not fit the run: a trained demo-sized checkpoint of another model, token files
    (ids beyond the vocabulary after the first 4,096 tokens), a file, a non-empty folder, a text
    file posing as a tokenizer, a URL on a port nothing listens on."""
    import socket

    import numpy as np

    (work / "file").write_text("x\n")
    (work / "full").mkdir()
    (work / "full" / "kept.txt").write_text("x\n")
    (work / "tokenizer.json").write_text("not json\n")
    tokens = np.zeros(8192, dtype=np.uint32)
    tokens[5000] = 4_000_000_000
    tokens.tofile(work / "beyond.npy")
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    other = work / "other"  # a tiny baseline: its checkpoint is of another model than the demo's
    tiny = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "data.sequence_length=32"]
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"),
         str(REPO / "configs/demo/baseline.yaml"), *tiny, "train.global_batch_size=4",
         "train.micro_batch_size=2", "train.max_steps=1", "run.save_interval=1",
         f"run.save_folder={other}", "eval.interval=1000"],
        cwd=work, capture_output=True, check=True, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    return {"checkpoint": str(other / "step1"), "url": f"http://127.0.0.1:{port}/tokens.npy"}


def _script(name: str) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / name)]


def _config_and_data_cases(work: Path, made: dict) -> list[tuple[str, list[str]]]:
    """(name, command) of the cases from the save folder to the tokenizer file, in table order."""
    train, demo = _script("train.py"), str(REPO / "configs/demo/baseline.yaml")
    folders = iter(range(1000))  # each case its own run folder (a case that writes one leaves it)

    def run() -> list[str]:
        return [
            f"run.save_folder={work / f'run{next(folders)}'}",
            "train.max_steps=1",
            "train.warmup_steps=0",
        ]

    numpy = ["data.source=numpy", "train.global_batch_size=2", "train.micro_batch_size=2"]
    return [
        ("save folder is a file", [*train, demo, f"run.save_folder={work / 'file'}"]),
        (
            "data glob matching nothing",
            [*train, demo, *run(), *numpy, f"data.paths=[{work}/none/*.npy]"],
        ),
        ("train.device=cuda without CUDA", [*train, demo, *run(), "train.device=cuda"]),
        (
            "micro_batch_size not dividing the batch",
            [*train, demo, *run(), "train.micro_batch_size=3"],
        ),
        (
            "count_params: bad value (train.lr=fast)",
            [*_script("count_params.py"), demo, "train.lr=fast"],
        ),
        ("count_params: missing config", [*_script("count_params.py"), str(work / "missing.yaml")]),
        (
            "count_params: micro_batch_size=3",
            [*_script("count_params.py"), demo, "train.micro_batch_size=3"],
        ),
        (
            "count_params: train.device=cuda",
            [*_script("count_params.py"), demo, "train.device=cuda"],
        ),
        (
            "--resume-from a checkpoint of another model",
            [*train, demo, *run(), "--resume-from", made["checkpoint"]],
        ),
        (
            "token id beyond the vocabulary (after 4,096)",
            [*train, demo, *run(), *numpy, f"data.paths=[{work}/beyond.npy]"],
        ),
        (
            "data URL nothing listens on",
            [*train, demo, *run(), *numpy, f"data.paths=[{made['url']}]"],
        ),
        ("model.n_layers=99999999999", [*train, demo, *run(), "model.n_layers=99999999999"]),
        (
            "tokenizer file not JSON (--dry-run)",
            [*train, demo, *run(), f"data.tokenizer_file={work}/tokenizer.json", "--dry-run"],
        ),
    ]


def _script_cases(work: Path, made: dict, busy: Path) -> list[tuple[str, list[str]]]:
    """(name, command) of the cases from export_hf to the bad arguments, in table order."""
    train, gpt = _script("train.py"), str(REPO / "configs/113M/baseline.yaml")
    return [
        (
            "export_hf into a non-empty folder",
            [*_script("export_hf.py"), made["checkpoint"], str(work / "full")],
        ),
        ("search: impossible budget", [*_script("search.py"), "1000"]),
        (
            "search: impossible attention",
            [*_script("search.py"), gpt, "--K", "4", "--layers", "6", "--attention", "1e12"],
        ),
        ("evaluate --device tpu", [*_script("evaluate.py"), made["checkpoint"], "--device", "tpu"]),
        (
            "bad config (train.lr=abc)",
            [*train, str(REPO / "configs/demo/baseline.yaml"), "train.lr=abc"],
        ),
        (
            "bad config in a file (1B, model.K=0)",
            [*train, str(REPO / "configs/1B/hourglass.yaml"), "model.K=0"],
        ),
        (
            "bad config, the last check (1B, model.vocab_size=5)",
            [*train, str(REPO / "configs/1B/hourglass.yaml"), "model.vocab_size=5"],
        ),
        (
            "busy run folder",
            [
                *train,
                str(REPO / "configs/demo/baseline.yaml"),
                f"run.save_folder={busy}",
                "train.max_steps=1",
            ],
        ),
        *(
            (
                f"bad argument: {s} --no-such-flag",
                [sys.executable, str(REPO / "scripts" / s), "--no-such-flag"],
            )
            for s in SCRIPTS
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="fresh processes per case (the median is printed)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        busy = work / "busy"
        from olmo_patches.launch.run_folder import Lock

        Lock(busy).acquire()  # held by this process (alive) for the busy case
        made = _artifacts(work)
        cases = [*_config_and_data_cases(work, made), *_script_cases(work, made, busy)]
        print(f"{'case':<52} {'median s':>9}  exit  lines  last line")
        for name, cmd in cases:
            seconds, code, n, line = _time(cmd, args.repeats, work)
            print(f"{name:<52} {seconds:>9.2f}  {code:>4}  {n:>5}  {line}", flush=True)


if __name__ == "__main__":
    main()
