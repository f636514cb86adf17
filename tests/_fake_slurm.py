"""A fake SLURM for running scripts/launch_slurm.sbatch offline: srun, scontrol, squeue and
python written as small shell scripts on PATH, each recording its argv (one NUL-terminated
argument per field) in the log folder.

- ``srun``: records its argv, then waits (``hold=True``) until SIGTERM, which it records and
  exits 0, as a run saving its checkpoint would.
- ``scontrol show hostnames``: the job's nodes, node001..nodeN; ``scontrol requeue ID``: recorded.
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
        '  trap \'echo TERM >> "$FAKE_SLURM_LOG/srun.signals"; exit 0\' TERM\n'
        '  while :; do sleep 0.1; done\n'
        'fi\n'
    ),
    "scontrol": (
        'case "$1" in\n'
        '  show) for i in $(seq 1 "$FAKE_NODES"); do printf "node%03d\\n" "$i"; done ;;\n'
        '  requeue) printf "%s\\0" "$@" >> "$FAKE_SLURM_LOG/scontrol.requeue" ;;\n'
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

    def start(self, *args: str, nodes: int = 1, gpus: str = "8", hold: bool = False, python_exit: int = 0):
        """``sbatch --nodes NODES scripts/launch_slurm.sbatch ARGS`` as SLURM runs the batch step."""
        env = dict(
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            FAKE_SLURM_LOG=str(self.log),
            FAKE_NODES=str(nodes),
            FAKE_PYTHON_EXIT=str(python_exit),
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
