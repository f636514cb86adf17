"""Seeds and learning rates in a sweep: each is a run of its own (name, folder, seeds, LR),
launched, resumed and counted as any run."""

import json
import os
import shlex

import pytest
import yaml

from olmo_patches.launch.sweep import Variants, launch_slurm, load_sweep, seed_of

from .conftest import REPO, TINY, run_in_process

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

DEMO_SEED, DEMO_LR = (
    6198,
    3.0e-3,
)  # configs/demo/baseline.yaml's train.seed (the default) and train.lr


def _config(root):
    cfg = root / "configs"
    cfg.mkdir()
    (cfg / "s.yaml").write_text(
        f"extends: {REPO / 'configs/demo/baseline.yaml'}\n"
        f"run: {{name: s, save_folder: {root / 'runs' / 's'}}}\n"
        "train: {max_steps: 2}\n"
    )
    return cfg


def test_each_seed_and_lr_is_a_run_of_its_own(tmp_path):
    cfg = _config(tmp_path)
    members = load_sweep(
        [str(cfg)], [], Variants(seeds=(0, 2), vary=("order",), lr_scales=(0.5, 1.0))
    )
    got = {
        (m.name, m.folder.name, m.spec.train.seed, m.spec.data.order_seed, m.spec.train.lr, m.group)
        for m in members
    }
    assert got == {
        ("s-lr0.5x", "s-lr0.5x", DEMO_SEED, DEMO_SEED, DEMO_LR / 2, "s"),
        (
            "s-lr0.5x-seed2-order",
            "s-lr0.5x-seed2-order",
            DEMO_SEED,
            DEMO_SEED + 2,
            DEMO_LR / 2,
            "s",
        ),
        ("s", "s", DEMO_SEED, DEMO_SEED, DEMO_LR, "s"),  # offset 0 at scale 1: the config's own run
        ("s-seed2-order", "s-seed2-order", DEMO_SEED, DEMO_SEED + 2, DEMO_LR, "s"),
    }  # --vary order is a run of its own, not the --vary both run of that seed
    init = load_sweep([str(cfg)], [], Variants(seeds=(3,), vary=("init",)))
    assert [(m.name, m.spec.train.seed, m.spec.data.order_seed) for m in init] == [
        ("s-seed3-init", DEMO_SEED + 3, DEMO_SEED)
    ]
    assert [seed_of(m.name) for m in init] == [("s", 3)]  # the report's seed 3 of s


def test_a_seed_trains_with_its_seeds_and_status_counts_it(tmp_path, demo_corpus):
    cfg = _config(tmp_path)
    sets = [
        a
        for o in [*TINY, "eval.interval=2", f"data.work_dir={tmp_path / 'cache'}"]
        for a in ("--set", o)
    ]
    r = run_in_process("sweep.py", "launch", "--local", str(cfg), "--seed-list", "1", *sets)
    assert r.returncode == 0, r.stderr[-3000:]
    recorded = yaml.safe_load((tmp_path / "runs" / "s-seed1" / "config.yaml").read_text())
    assert (
        recorded["train"]["seed"] == DEMO_SEED + 1
        and recorded["data"]["order_seed"] == DEMO_SEED + 1
    )
    assert (
        recorded["run"]["name"] == "s-seed1" and (tmp_path / "runs" / "s-seed1" / "step2").is_dir()
    )
    assert not (tmp_path / "runs" / "s").exists()  # seed 0 was not asked for
    again = run_in_process("sweep.py", "launch", "--local", str(cfg), "--seed-list", "1", *sets)
    assert "s-seed1: done, skipped" in again.stdout
    # the trained folder's recorded (resolved) config is the member's at that seed: the report takes
    # it
    out = tmp_path / "report"
    reported = run_in_process(
        "sweep.py", "report", str(cfg), "--seed-list", "1", *sets, "--out", str(out), "--no-figures"
    )
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert "| s | 0.003 (config) | 1 |" in (out / "comparison.md").read_text()
    status = run_in_process("sweep.py", "status", str(cfg), "--seeds", "3", *sets)
    assert status.returncode == 0, status.stderr[-3000:]
    counts = [line for line in status.stdout.splitlines() if line.startswith("│ s ")][
        -1
    ]  # the seeds table
    # config, LR x, seeds, done, running, stopped, failed, not started
    assert [c.strip() for c in counts.split("│")[1:-1]] == [
        "s",
        "1",
        "3",
        "1",
        "0",
        "0",
        "0",
        "2",
    ], status.stdout


def test_slurm_manifest_carries_each_runs_seed_and_lr(tmp_path, monkeypatch):
    """A seeded LR grid on SLURM: one array element per run, each manifest line the config, the
    sweep's overrides, then the run's own (a fake sbatch records the call)."""
    cfg = _config(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/sbatch.args; echo "77;cluster"\n'
    )
    sbatch.chmod(0o755)
    for tool in ("squeue", "sacct"):
        (bin_dir / tool).write_text("#!/bin/bash\ntrue\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    members = load_sweep(
        [str(cfg)], ["train.z_loss=0"], Variants(seeds=(0, 1), lr_scales=(1.0, 2.0))
    )
    assert launch_slurm(members, ["train.z_loss=0"], nodes=1, gpus_per_node=1) == "77"
    args = (tmp_path / "sbatch.args").read_text().splitlines()
    assert "--array=0-3" in args
    lines = [
        shlex.split(line) for line in open(args[args.index("--array", 2) + 1]).read().splitlines()
    ]
    runs = tmp_path / "runs"
    assert lines == [
        [str(cfg / "s.yaml"), "train.z_loss=0"],
        [str(cfg / "s.yaml"), "train.z_loss=0", f"train.seed={DEMO_SEED + 1}",
         f"data.order_seed={DEMO_SEED + 1}", "run.name=s-seed1",
         f"run.save_folder={runs / 's'}-seed1"],
        [str(cfg / "s.yaml"), "train.z_loss=0", f"train.lr={2 * DEMO_LR}", "run.name=s-lr2x",
         f"run.save_folder={runs / 's'}-lr2x"],
        [str(cfg / "s.yaml"), "train.z_loss=0", f"train.lr={2 * DEMO_LR}",
         f"train.seed={DEMO_SEED + 1}", f"data.order_seed={DEMO_SEED + 1}", "run.name=s-lr2x-seed1",
         f"run.save_folder={runs / 's'}-lr2x-seed1"],
    ]  # fmt: skip
    claims = [
        json.loads((runs / n / "sweep-claim.json").read_text())["slurm_job"]
        for n in ("s", "s-seed1", "s-lr2x", "s-lr2x-seed1")
    ]
    assert claims == ["77_0", "77_1", "77_2", "77_3"]
