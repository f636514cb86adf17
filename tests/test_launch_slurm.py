"""scripts/launch_slurm.sbatch against a fake SLURM (tests/_fake_slurm.py): the pre-flight check and
the torchrun line it builds for 1 and 2 nodes, HSDP across nodes, overrides passed through as given,
and the requeue at the time limit (USR1)."""

import signal
import time

import pytest
from torch.distributed.run import get_args_parser

from ._fake_slurm import fake_slurm

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


def test_requeue_on_usr1(slurm):
    proc = slurm.start(CONFIG, "train.lr=1e-3", nodes=2, hold=True)
    deadline = time.monotonic() + 60
    while slurm.args("srun") is None or not _catches(proc.pid, signal.SIGUSR1):  # srun running, trap set
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err  # the run saved and exited 0; so does the batch script
    assert slurm.requeues() == ["requeue", "4242"]
    assert slurm.signals() == ["TERM"]
