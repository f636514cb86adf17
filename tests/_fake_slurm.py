"""A fake SLURM for running scripts/launch_slurm.sbatch offline: srun, scancel, scontrol, squeue and
python on PATH (tests/_fake_slurm_bin.py says what each does and which SLURM source or manual page
it follows), each recording its argv (NUL-separated) in the log folder.

:class:`FakeSlurm` starts the batch script as slurmd would (SLURM_* variables, its own process
group) and plays slurmctld's part: ``time_limit_warning`` (``--signal=B:USR1@LEAD``: the batch shell
alone), ``preempt`` (GraceTime: SIGCONT and SIGTERM to the steps, then at its end the job ends:
SIGTERM to every process, batch script included, SIGKILL after KillWait) and ``scancel``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import _fake_slurm_bin as fake
from .conftest import REPO, finish, start

SBATCH = REPO / "scripts" / "launch_slurm.sbatch"
TOOLS = ("srun", "scancel", "scontrol", "squeue", "python")


@dataclass
class FakeSlurm:
    log: Path
    bin: Path
    kill_wait: float = 30.0
    job: str = ""

    def args(self, tool: str) -> list[str] | None:
        """The argv a fake received (None: not called)."""
        path = self.log / f"{tool}.args"
        return path.read_bytes().decode().split("\0")[:-1] if path.exists() else None

    def requeues(self) -> list[str]:
        return self.args("scontrol.requeue") or []

    def _lines(self, name: str) -> list[str]:
        path = self.log / name
        return path.read_text().split() if path.exists() else []

    def signals(self) -> list[str]:
        """The signals srun itself received."""
        return self._lines("srun.signals")

    def rank_signals(self) -> list[str]:
        """The signals the stand-in ranks received."""
        return self._lines("rank.signals")

    def saved(self) -> bool:
        """Whether the stand-in run's checkpoint was written."""
        return (self.log / "checkpoint").exists()

    def steps_alive_at_requeue(self) -> list[int]:
        """How many processes of srun's steps were alive at each ``scontrol requeue``."""
        return [int(n) for n in self._lines("requeue.steps_alive")]

    def start(
        self,
        *args: str,
        nodes: int = 1,
        gpus: str = "8",
        run: bool = False,
        stand_in: bool = False,
        python_exit: int = 0,
        save_s: float = 0.0,
        kill_wait: float = 30.0,
        **env: str,
    ):
        """``sbatch --nodes NODES scripts/launch_slurm.sbatch ARGS`` as SLURM runs the batch step.
        srun runs its command (``run``; ``stand_in``: a stand-in rank that takes ``save_s`` to save)
        or only records it; a job's end kills what is left ``kill_wait`` s after its SIGTERM."""
        self.kill_wait = kill_wait
        self.job = str(self.log)
        variables = dict(
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            FAKE_SLURM_LOG=str(self.log),
            FAKE_SLURM_JOB=self.job,
            FAKE_NODES=str(nodes),
            FAKE_PYTHON_EXIT=str(python_exit),
            FAKE_SAVE_S=str(save_s),
            FAKE_KILL_WAIT=str(kill_wait),
            FAKE_REAL_PYTHON=sys.executable,
            SLURM_JOB_ID="4242",
            SLURM_JOB_NUM_NODES=str(nodes),
            SLURM_JOB_NODELIST=f"node[001-{nodes:03d}]",
            SLURM_GPUS_PER_NODE=gpus,
            SLURM_SUBMIT_DIR=str(REPO),
            **{fake.MARK: f"{self.job}/batch"},
            **env,
        )
        if run or stand_in:
            variables["FAKE_SRUN_RUN"] = "1"
        if stand_in:
            variables["FAKE_STAND_IN"] = "1"
        proc = start(["bash", SBATCH, *args], **variables)
        (self.log / "batch.pid").write_text(str(proc.pid))
        return proc

    def run(self, *args: str, **kwargs):
        return finish(self.start(*args, **kwargs), timeout=60)

    def _env(self) -> dict:
        return dict(
            os.environ,
            FAKE_SLURM_LOG=str(self.log),
            FAKE_SLURM_JOB=self.job,
            SLURM_JOB_ID="4242",
            FAKE_KILL_WAIT=str(self.kill_wait),
        )

    def scancel(self, *args: str) -> None:
        """``scancel ARGS 4242``, run by the user (outside the job)."""
        env = {k: v for k, v in self._env().items() if k.startswith(("FAKE_", "SLURM_"))}
        r = finish(start([self.bin / "scancel", *args, "4242"], **env), timeout=60)
        assert r.returncode == 0, r.stderr

    def step_processes(self) -> list[int]:
        return fake.processes(self.job, fake._steps_of(self.job)) if self.job else []

    def job_processes(self) -> list[int]:
        return fake.processes(self.job) if self.job else []

    def time_limit_warning(self) -> None:
        """``--signal=B:USR1@LEAD`` at its time: USR1 to the batch shell alone (sbatch(1),
        --signal)."""
        self.scancel("--batch", "--signal=USR1")

    def preempt(self, grace_s: float) -> threading.Thread:
        """Preemption with GraceTime (slurm.conf(5) GraceTime; src/interfaces/preempt.c): SIGCONT
        and SIGTERM to the tasks (every step, not the batch script) now; at the new end time, the
        job ends (SIGCONT and SIGTERM to all of it, SIGKILL KillWait s later)."""
        self.scancel("--signal=CONT")
        self.scancel("--signal=TERM")

        def grace_ends():
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self.job_processes():
                time.sleep(0.1)
            if self.job_processes():
                (self.log / "grace.expired").touch()
                fake.signal_all(self.job_processes(), signal.SIGCONT)
                fake.signal_all(self.job_processes(), signal.SIGTERM)
                deadline = time.monotonic() + self.kill_wait
                while time.monotonic() < deadline and self.job_processes():
                    time.sleep(0.1)
                fake.signal_all(self.job_processes(), signal.SIGKILL)

        thread = threading.Thread(target=grace_ends, daemon=True)
        thread.start()
        return thread

    def grace_expired(self) -> bool:
        return (self.log / "grace.expired").exists()


def fake_slurm(root: Path) -> FakeSlurm:
    """Write the fakes under ``root``."""
    bin_dir, log = root / "bin", root / "log"
    bin_dir.mkdir(parents=True)
    log.mkdir()
    for name in TOOLS:
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(fake.__file__)}" {name} "$@"\n')
        path.chmod(0o755)
    return FakeSlurm(log, bin_dir)
