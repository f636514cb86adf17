"""Checks for the ranks a run will have, at load and before anything is written: the per-rank batch,
the micro-batch (lowered to it, or refused), HSDP's node layout, the presets per rank; the demo
configs unchanged under torchrun on CPU, with one process's losses."""

import logging

import pytest

from olmo_patches.cli import load_or_exit
from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import Layout, load_and_resolve
from olmo_patches.train import train
from olmo_patches.launch.run_folder import read_metrics

from .conftest import REPO, Records, run_in_process, train_each

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

DEMO = REPO / "configs" / "demo"
OLMO2_1B = REPO / "configs" / "1B" / "olmo2.yaml"


def _train_py(*argv: str) -> tuple[int, str, str]:
    """scripts/train.py in this process: (exit code, stdout, stderr)."""
    r = run_in_process("train.py", *argv)
    return r.returncode, r.stdout, r.stderr


def test_micro_batch_above_the_per_rank_batch_is_lowered():
    # The demo: global 16 = micro 16, right for one process; two ranks take 16 / 2 = 8 each.
    assert (
        load_and_resolve(DEMO / "baseline.yaml", layout=Layout.plan(1)).train.micro_batch_size == 16
    )
    logger, records = logging.getLogger("olmo_patches.launch"), Records()
    logger.addHandler(records)
    level, logger.level = logger.level, logging.INFO
    try:
        t = load_and_resolve(DEMO / "baseline.yaml", layout=Layout.plan(2)).train
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert (t.global_batch_size, t.micro_batch_size) == (16, 8)
    assert [m for m in records.messages if "micro_batch_size" in m] == [
        "train.micro_batch_size=16 > the per-rank batch 8 (16 sequences / 2 ranks (1 node x 2)): "
        "using 8"
    ]


@pytest.mark.parametrize(
    "overrides, layout, key",
    [
        (
            ["train.global_batch_size=16"],
            Layout.plan(3),
            "train.global_batch_size=16",
        ),  # 16 / 3 ranks
        (
            ["train.global_batch_size=16"],
            Layout.plan(8, 4),
            "train.global_batch_size=16",
        ),  # fewer sequences than ranks
        (
            ["train.global_batch_size=24", "train.micro_batch_size=4"],
            Layout.plan(4),
            "train.micro_batch_size=4",
        ),  # 4 does not divide 6
        (
            ["train.global_batch_size=24", "train.micro_batch_size=4", "train.data_parallel=hsdp"],
            Layout(12, 8, 1),
            "train.data_parallel=hsdp",
        ),
    ],
)
def test_impossible_layouts_fail_with_one_line(overrides, layout, key):
    with pytest.raises(ConfigError) as e:
        load_and_resolve(DEMO / "baseline.yaml", overrides, layout=layout)
    assert "command line: " + key in str(e.value) and "\n" not in str(e.value)


def test_layout_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.delenv("NUM_NODES", raising=False)
    assert Layout.from_env() == Layout(16, 8, 2)
    assert (
        load_and_resolve(DEMO / "baseline.yaml").train.micro_batch_size == 1
    )  # 16 sequences / 16 ranks
    assert (
        load_and_resolve(DEMO / "baseline.yaml", ["train.data_parallel=hsdp"]).train.data_parallel
        == "hsdp"
    )


def test_dry_run_plans_the_preset_per_rank():
    """OLMo-2 1B on B200s: 512 sequences over 8 ranks gives 64 per rank (docs/running.md's table:
    micro-batch 16); over 16 nodes x 8 = 128 ranks, 4 per rank, so the micro-batch is at most 4."""
    code, out, _ = _train_py(
        str(OLMO2_1B), "train.hardware=b200", "--dry-run", "--nproc-per-node", "8"
    )
    assert code == 0 and "micro_batch_size: 16\n" in out
    code, out, _ = _train_py(
        str(OLMO2_1B), "--dry-run", "--nproc-per-node", "8", "--nodes", "16", "train.hardware=b200"
    )
    assert code == 0 and "micro_batch_size: 4\n" in out and "128 ranks (16 nodes x 8)" in out


def test_dry_run_refuses_an_impossible_launch(tmp_path):
    # The file that sets the key, named relative to the working folder (from another folder: to the
    # package's).
    r = run_in_process(
        "train.py", str(DEMO / "hourglass.yaml"), "--dry-run", "--nproc-per-node", "3", cwd=REPO
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "config error: configs/demo/baseline.yaml: train.global_batch_size=16: "
        "is not divisible by the 3 ranks (1 node x 3): each rank takes a whole number of sequences"
    ]
    elsewhere = run_in_process(
        "train.py", str(DEMO / "hourglass.yaml"), "--dry-run", "--nproc-per-node", "3", cwd=tmp_path
    )
    assert elsewhere.stderr == r.stderr
    code, _, err = _train_py(
        str(DEMO / "hourglass.yaml"), "--nproc-per-node", "2"
    )  # a plan needs --dry-run
    assert code == 2 and "--dry-run" in err


def test_only_rank_0_prints_the_error(monkeypatch, capsys, tmp_path):
    """Every rank checks the same config and exits 2; one line in all, from rank 0."""
    bad = [
        "train.global_batch_size=15",
        "train.micro_batch_size=5",
        f"run.save_folder={tmp_path / 'run'}",
    ]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv(
            "LOCAL_RANK", rank
        )  # as torchrun sets it (an in-process run before may leave LOCAL_RANK=0)
        with pytest.raises(SystemExit) as e:
            load_or_exit(str(DEMO / "baseline.yaml"), bad)
        assert e.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert lines == (
            []
            if rank == "1"
            else [
                "config error: command line: train.global_batch_size=15: "
                "is not divisible by the 2 ranks (1 node x 2): "
                "each rank takes a whole number of sequences"
            ]
        )
    assert not (tmp_path / "run").exists()


# The demo's shape and batches unchanged (global 16 = micro 16); shorter sequences, 3 steps, 2 eval
# batches.
SHRINK = ["data.sequence_length=32", "train.max_steps=3", "eval.interval=3", "eval.max_batches=2"]


def _losses(run_dir):
    keys = ("train/CE loss", "eval/lm/val/CE loss")
    return {(step, k): m[k] for step, m in read_metrics(run_dir).items() for k in keys if k in m}


NAMES = ["baseline", "hourglass", "variable-width"]


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory, demo_corpus):
    """configs/demo/NAME.yaml, batches unchanged, on 2 ranks as torchrun --standalone
    --nproc-per-node 2 starts them (conftest.train_each: forked ranks), each config its own run and
    folder."""
    root = tmp_path_factory.mktemp("torchrun")
    return root, train_each(
        [
            [
                str(DEMO / f"{n}.yaml"),
                *SHRINK,
                f"data.work_dir={root / n / 'cache'}",
                f"run.save_folder={root / n}",
            ]
            for n in NAMES
        ]
    )


@pytest.mark.parametrize("name", NAMES)
def test_demo_config_under_torchrun_matches_one_process(tmp_path, under_torchrun, name):
    """configs/demo/NAME.yaml under torchrun with 2 ranks and in one process: the same losses (the
    global batch is the same)."""
    root, r = under_torchrun
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("train.micro_batch_size=16 > the per-rank batch 8") == len(
        NAMES
    )  # rank 0's info line, once a run
    one, two = tmp_path / "one", root / name
    train(
        load_and_resolve(
            DEMO / f"{name}.yaml",
            [*SHRINK, f"data.work_dir={tmp_path / 'cache'}", f"run.save_folder={one}"],
            layout=Layout.plan(1),
        )
    )
    l1, l2 = _losses(one), _losses(two)
    assert sorted(l1) == sorted(l2) and {s for s, _ in l1} == {0, 1, 2, 3}
    print(f"{name}: " + ", ".join(f"{k[1]}@{k[0]} {l1[k]:.6f}/{l2[k]:.6f}" for k in sorted(l1)))
    for k in l1:
        assert l2[k] == pytest.approx(l1[k], rel=1e-5, abs=1e-6), k
