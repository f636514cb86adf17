"""How long a refusal takes: a bad config, a busy run folder and a bad argument to each script, each in a
fresh process (the median of --repeats), the one line it printed and its exit code.

    python benchmarks/bench_refusal.py [--repeats 5]

A refusal should come before any work and within seconds: a bad config is read and checked before torch
is imported; a busy run folder is found once the training stack is loaded (the lock is taken there).
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


def _time(cmd: list[str], repeats: int, cwd: Path) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    seconds, last = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        last = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        seconds.append(time.perf_counter() - start)
    lines = (last.stderr or last.stdout).strip().splitlines()
    return statistics.median(seconds), last.returncode, lines[-1][:90] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per case (the median is printed)")
    args = parser.parse_args()
    train = [sys.executable, str(REPO / "scripts" / "train.py")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        busy = work / "busy"
        from olmo_patches.launch.run_folder import Lock

        Lock(busy).acquire()  # held by this process (alive) for the busy case
        cases = [
            ("bad config (train.lr=abc)", [*train, str(REPO / "configs/demo/baseline.yaml"), "train.lr=abc"]),
            ("bad config in a file (1B, model.K=0)", [*train, str(REPO / "configs/1B/hourglass.yaml"), "model.K=0"]),
            (
                "bad config, the last check (1B, model.vocab_size=5)",
                [*train, str(REPO / "configs/1B/hourglass.yaml"), "model.vocab_size=5"],
            ),
            (
                "busy run folder",
                [*train, str(REPO / "configs/demo/baseline.yaml"), f"run.save_folder={busy}", "train.max_steps=1"],
            ),
            *(
                (f"bad argument: {s} --no-such-flag", [sys.executable, str(REPO / "scripts" / s), "--no-such-flag"])
                for s in SCRIPTS
            ),
        ]
        print(f"{'case':<52} {'median s':>9}  exit  line")
        for name, cmd in cases:
            seconds, code, line = _time(cmd, args.repeats, work)
            print(f"{name:<52} {seconds:>9.2f}  {code:>4}  {line}", flush=True)


if __name__ == "__main__":
    main()
