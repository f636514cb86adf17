"""scripts/launch_slurm.sbatch against a fake SLURM (tests/_fake_slurm.py): the pre-flight check and
the torchrun line it builds for 1 and 2 nodes, HSDP across nodes, overrides passed through as given,
and at the time limit (USR1) the save before the requeue, which ends the job after a KillWait."""

import os
import re
import signal
import time

import pytest
from torch.distributed.run import get_args_parser

from olmo_patches.launch.layout import Layout, load_and_resolve
from olmo_patches.report.counts import count
from olmo_patches.report.plan import signal_lead

from ._fake_slurm import SBATCH, fake_slurm
from .conftest import REPO, finish

CONFIG = "configs/1B/hourglass.yaml"
# Values a shell would split, glob or re-parse if the script re-quoted them.
ODD = ["run.name=my run", "run.wandb_project=a=b", "eval.validation_sets=[c4_en,wikitext_103]", "run.save_folder=/tmp/x y/*"]


@pytest.fixture
def slurm(tmp_path):
    return fake_slurm(tmp_path)


def _torchrun(slurm):
    """srun's argv: its own flag, then a torchrun command parsed with torchrun's own parser."""
    argv = slurm.args("srun")
    assert argv[:2] == ["--kill-on-bad-exit=1", "torchrun"], argv
    return get_args_parser().parse_args(argv[2:])


@pytest.mark.parametrize("nodes, gpus, procs", [(1, "8", 8), (2, "8", 8), (4, "h100:4", 4)])
def test_torchrun_line(slurm, nodes, gpus, procs):
    r = slurm.run(CONFIG, "train.lr=1e-3", nodes=nodes, gpus=gpus)
    assert r.returncode == 0, r.stderr
    t = _torchrun(slurm)
    assert (t.nnodes, t.nproc_per_node) == (str(nodes), str(procs))
    assert (t.rdzv_backend, t.rdzv_endpoint, t.rdzv_id) == ("c10d", "node001:29500", "4242")
    # torchrun waits for its workers' save as long as the time-limit signal's lead (torchrun's default: 30 s).
    lead = int(re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", SBATCH.read_text(), re.M).group(1))
    assert t.shutdown_timeout == lead
    hsdp = ["train.data_parallel=hsdp"] if nodes > 1 else []  # HSDP exactly when multi-node
    assert [t.training_script, *t.training_script_args] == ["scripts/train.py", CONFIG, *hsdp, "train.lr=1e-3"]
    # The pre-flight: the same arguments, checked and planned for these ranks before srun.
    plan = ["--dry-run", "--nproc-per-node", str(procs), "--nodes", str(nodes)]
    assert slurm.args("python") == ["scripts/train.py", CONFIG, *hsdp, "train.lr=1e-3", *plan]


def test_overrides_pass_through_unchanged(slurm):
    r = slurm.run(CONFIG, *ODD, "train.data_parallel=fsdp", nodes=2)
    assert r.returncode == 0, r.stderr
    t = _torchrun(slurm)
    # The user's own data_parallel comes last, so it wins over the script's HSDP.
    assert t.training_script_args == [CONFIG, "train.data_parallel=hsdp", *ODD, "train.data_parallel=fsdp"]
    assert slurm.args("python")[1:-5] == t.training_script_args


def test_bad_config_stops_before_srun(slurm):
    r = slurm.run(CONFIG, "train.global_batch_size=12", nodes=1, python_exit=2)
    assert r.returncode == 2
    assert slurm.args("srun") is None and slurm.requeues() == []


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: SigCgt in /proc/PID/status)."""
    line = next(l for l in open(f"/proc/{pid}/status") if l.startswith("SigCgt:"))
    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)


def _signal_when_running(slurm, sig: int, **kwargs):
    """Start the batch script with a run that takes 1 s to save, send ``sig`` once srun runs, wait."""
    proc = slurm.start(CONFIG, "train.lr=1e-3", nodes=2, hold=True, save_s=1.0, **kwargs)
    deadline = time.monotonic() + 60
    while slurm.args("srun") is None or not _catches(proc.pid, sig):  # srun running, trap set
        if time.monotonic() > deadline or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGKILL)  # the held srun with it
            pytest.fail(f"no srun, or no trap for signal {sig}: {proc.communicate()}")
        time.sleep(0.05)
    proc.send_signal(sig)
    return finish(proc, timeout=30)


def test_time_limit_saves_then_requeues(slurm):
    # A requeue ends the job: SIGTERM to all of it, SIGKILL after KillWait (here 0.3 s, shorter than the save).
    _signal_when_running(slurm, signal.SIGUSR1, kill_wait=0.3)
    assert slurm.signals() == ["TERM"]  # passed on once
    assert slurm.saved() and slurm.saved_before_requeue()  # the checkpoint, then the requeue
    assert slurm.requeues() == ["requeue", "4242"]


def test_preemption_sigterm_saves_without_requeue(slurm):
    # Preemption: SLURM signals the batch script too; it passes SIGTERM on and waits for the save.
    _signal_when_running(slurm, signal.SIGTERM)
    assert slurm.signals() == ["TERM"] and slurm.saved()
    assert slurm.requeues() == []  # SLURM's preemption requeues (or cancels) the job itself


def test_signal_lead_covers_a_step_and_a_save():
    spec = load_and_resolve(REPO / "configs/8B/hourglass-revised.yaml")
    n = count(spec)
    # A lower bound on one step on 8 RTX 6000 Ada (364.2 TFLOP/s dense bf16) at 40% MFU: 6 FLOPs per
    # non-embedding weight per token; one save: fp32 weights and AdamW's two moments at 1 GiB/s.
    step = 6 * n.non_embedding * spec.train.global_batch_size * spec.data.sequence_length / (8 * 364.2e12 * 0.4)
    save = 12 * n.total / 2**30
    lead, how = signal_lead(spec, Layout(world_size=8, local=8, nodes=1))
    assert step + save + 60 <= lead < step + save + 60 + 60 and lead % 30 == 0
    assert lead > 300 and how.startswith(f"--signal=B:USR1@{lead}:")  # more than the script's default
