"""A shipped config's exact widths through the real parallel path on gloo:
configs/113M/hourglass.yaml (d_model 1440, d_h 678, K 2, 20 heads of 72), its depth cut to 2, the
demo's data and vocabulary, 16-token sequences: FSDP over 3 ranks (an odd count: 678 rows a sub-MLP,
K d_h = 1356 and 1440 split unevenly and FSDP2 pads them) trains one step with one process's losses
(the validation loss after the step carries the reduced gradients and the sharded AdamW update). The
shard shares at every shipped shape and rank count are tests/test_shipped_shards.py's (a fake
process group); this runs the collectives."""

import pytest

from olmo_patches.launch.layout import Layout, load_and_resolve
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.train import train

from .conftest import REPO, train_each

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

HOURGLASS_113M = REPO / "configs" / "113M" / "hourglass.yaml"
CUT = [
    "model.n_layers=2",
    "model.vocab_size=4096",
    "data.source=demo",
    "data.tokenizer=demo",
    "data.sequence_length=16",
    "train.global_batch_size=6",
    "train.micro_batch_size=6",
    "train.max_tokens=null",
    "train.max_steps=1",
    "train.warmup_steps=1",
    "train.precision=fp32",
    "train.device=cpu",
    "train.hardware=none",
    "train.compile=false",
    "train.float8=off",
    "eval.interval=1000",
    "eval.max_batches=1",
    "eval.downstream_tasks=[]",
    "run.log_interval=1",
    "run.save_interval=1000",
    "run.ephemeral_save_interval=null",
]


# Micro-batch 6 = the global batch: 3 ranks lower it to their 2 (docs/running.md), and the
# validation batch (a micro-batch a rank) is 6 sequences in both runs, so eval.max_batches=1 reads
# the same ones.


def _overrides(folder, *extra):
    return [*CUT, f"run.save_folder={folder}", f"data.work_dir={folder.parent / 'cache'}", *extra]


def _losses(folder):
    keys = ("train/CE loss", "eval/lm/val/CE loss")
    return {(s, k): m[k] for s, m in read_metrics(folder).items() for k in keys if k in m}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_corpus):
    root = tmp_path_factory.mktemp("widths")
    r = train_each(
        [[str(HOURGLASS_113M), *_overrides(root / "fsdp3", "train.data_parallel=fsdp")]], world=3
    )
    train(load_and_resolve(HOURGLASS_113M, _overrides(root / "one"), layout=Layout.plan(1)))
    return root, r


def test_the_113M_hourglass_widths_train_over_three_fsdp_ranks_as_one_process(runs):
    root, r = runs
    assert r.returncode == 0, r.stderr[-3000:]
    spec = load_and_resolve(HOURGLASS_113M, _overrides(root / "x"), layout=Layout.plan(3))
    assert (spec.model.d_model, spec.model.d_h, spec.model.K, spec.model.n_heads) == (
        1440,
        678,
        2,
        20,
    )  # the shipped widths
    one, three = _losses(root / "one"), _losses(root / "fsdp3")
    assert sorted(one) == sorted(three) and {s for s, _ in one} == {
        0,
        1,
    }  # validation at 0 and after the step, the step's train loss
    print(", ".join(f"{k[1]}@{k[0]} {one[k]:.6f}/{three[k]:.6f}" for k in sorted(one)))
    for k in one:
        assert three[k] == pytest.approx(one[k], rel=1e-5), k
