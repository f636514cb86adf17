"""A fake SLURM for running scripts/launch_slurm.sbatch offline: srun, scontrol, squeue and
python written as small shell scripts on PATH, each recording its argv (one NUL-terminated
argument per field) in the log folder.

- ``srun``: records its argv, then waits (``hold=True``) until SIGTERM, which it records; then it
  "saves" as a run would (``save_s`` seconds, then ``LOG/checkpoint``) and exits 0.
- ``scontrol show hostnames``: the job's nodes, node001..nodeN; ``scontrol requeue ID``: recorded
  (with whether the checkpoint was there), then it ends the job as SLURM does: SIGTERM to every
  process of the job (the batch script's process group), SIGKILL ``kill_wait`` seconds later.
- ``squeue``: the job as RUNNING (the script does not need it; present as on a cluster).
- ``python``: records the pre-flight ``scripts/train.py ... --dry-run`` and exits ``python_exit``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .conftest import REPO, finish, start

SBATCH = REPO / "scripts" / "launch_slurm.sbatch"

_RECORD = 'printf "%s\\0" "$@" > "$FAKE_SLURM_LOG/$(basename "$0").args"\n'
_FAKES = {
    "srun": _RECORD + (
        'if [ -n "${FAKE_SRUN_HOLD:-}" ]; then\n'
        '  trap \'echo TERM >> "$FAKE_SLURM_LOG/srun.signals"; SAVE=1\' TERM\n'
        '  while [ -z "${SAVE:-}" ]; do sleep 0.05; done\n'
        '  (trap "" TERM; sleep "$FAKE_SAVE_S")  # a save takes its time; another SIGTERM does not hurry it\n'
        '  touch "$FAKE_SLURM_LOG/checkpoint"\n'
        'fi\n'
    ),
    "scontrol": (
        'case "$1" in\n'
        '  show) for i in $(seq 1 "$FAKE_NODES"); do printf "node%03d\\n" "$i"; done ;;\n'
        '  requeue) printf "%s\\0" "$@" >> "$FAKE_SLURM_LOG/scontrol.requeue"\n'
        '    [ -e "$FAKE_SLURM_LOG/checkpoint" ] && echo saved > "$FAKE_SLURM_LOG/requeue.checkpoint"\n'
        '    read -r _ _ _ _ JOB _ < /proc/$$/stat  # the job: the batch script\'s process group\n'
        '    setsid bash -c "kill -TERM -- -$JOB; sleep $FAKE_KILL_WAIT; kill -KILL -- -$JOB" 2>/dev/null &\n'
        '    ;;\n'
        'esac\n'
    ),
    "squeue": _RECORD + 'echo "$SLURM_JOB_ID RUNNING"\n',
    "python": _RECORD + 'exit "${FAKE_PYTHON_EXIT:-0}"\n',
}


@dataclass
class FakeSlurm:
    log: Path
    bin: Path

    def args(self, tool: str) -> list[str] | None:
        """The argv a fake received (None: not called)."""
        path = self.log / f"{tool}.args"
        return path.read_bytes().decode().split("\0")[:-1] if path.exists() else None

    def requeues(self) -> list[str]:
        path = self.log / "scontrol.requeue"
        return path.read_bytes().decode().split("\0")[:-1] if path.exists() else []

    def signals(self) -> list[str]:
        path = self.log / "srun.signals"
        return path.read_text().split() if path.exists() else []

    def saved(self) -> bool:
        """Whether the run's checkpoint was written."""
        return (self.log / "checkpoint").exists()

    def saved_before_requeue(self) -> bool:
        """Whether the checkpoint was there when ``scontrol requeue`` ran."""
        return (self.log / "requeue.checkpoint").exists()

    def start(self, *args: str, nodes: int = 1, gpus: str = "8", hold: bool = False, python_exit: int = 0,
              save_s: float = 0.0, kill_wait: float = 30.0):
        """``sbatch --nodes NODES scripts/launch_slurm.sbatch ARGS`` as SLURM runs the batch step; a held
        srun takes ``save_s`` to save; a requeue kills the job ``kill_wait`` after its SIGTERM."""
        env = dict(
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            FAKE_SLURM_LOG=str(self.log),
            FAKE_NODES=str(nodes),
            FAKE_PYTHON_EXIT=str(python_exit),
            FAKE_SAVE_S=str(save_s),
            FAKE_KILL_WAIT=str(kill_wait),
            SLURM_JOB_ID="4242",
            SLURM_JOB_NUM_NODES=str(nodes),
            SLURM_JOB_NODELIST=f"node[001-{nodes:03d}]",
            SLURM_GPUS_PER_NODE=gpus,
            SLURM_SUBMIT_DIR=str(REPO),
        )
        if hold:
            env["FAKE_SRUN_HOLD"] = "1"
        return start(["bash", SBATCH, *args], **env)

    def run(self, *args: str, **kwargs):
        return finish(self.start(*args, **kwargs), timeout=60)


def fake_slurm(root: Path) -> FakeSlurm:
    """Write the fakes under ``root``."""
    bin_dir, log = root / "bin", root / "log"
    bin_dir.mkdir(parents=True)
    log.mkdir()
    for name, body in _FAKES.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)
    return FakeSlurm(log, bin_dir)
