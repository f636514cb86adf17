"""Training through OLMo-core's own Trainer on CPU: steps, exact resume (two gloo processes:
test_world_size.py)."""

import gc
import json
import multiprocessing
import weakref

import pytest
import torch
from olmo_core.train.callbacks import Callback

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.train import train

from .conftest import REPO, load_weights, tiny_overrides, train_each

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"


def _losses(run_dir):
    return {
        step: m["train/CE loss"]
        for step, m in read_metrics(run_dir).items()
        if "train/CE loss" in m
    }


@pytest.mark.parametrize("block", ["baseline", "hourglass"])
def test_two_steps_through_trainer(tmp_path, demo_corpus, block):
    spec = load_and_resolve(BASELINE, tiny_overrides(tmp_path, "train.max_steps=2", block=block))
    models = []

    class Watch(Callback):
        def pre_train(self):
            models.append(weakref.ref(self.trainer.train_module.model))

    train(spec, callbacks={"watch": Watch()})
    # train() forks its data-preparation pools on CPU and freezes the garbage collector for the run:
    # both are put back (OLMo-core's "spawn"; nothing frozen) for whatever the process does next,
    # and nothing keeps the run's model alive (OLMo-core's lru_cache on num_flops_per_token did)
    assert multiprocessing.get_start_method() == "spawn"
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert len(models) == 1 and models[0]() is None
    losses = _losses(tmp_path)
    assert sorted(losses) == [1, 2]
    assert all(0 < loss < 20 for loss in losses.values())
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "step2" / "model_and_optim").is_dir()
    before, after = load_weights(tmp_path / "step0"), load_weights(tmp_path / "step2")
    assert set(before) == set(after)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # The checkpoint's model has the shape the config asked for.
    key = "blocks.0.feed_forward.w1.weight"
    assert after[key].shape == (
        (32 * 4, 32) if block == "baseline" else (2 * 16, 32)
    )  # hourglass: (K d_h, d_model)


def test_stop_and_resume_is_bit_identical(tmp_path, demo_corpus):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(load_and_resolve(BASELINE, tiny_overrides(straight, "train.max_steps=6")))
    train(
        load_and_resolve(
            BASELINE, tiny_overrides(resumed, "train.max_steps=6", "run.stop_at_step=3")
        )
    )
    assert sorted(_losses(resumed)) == [1, 2, 3] and not (resumed / "step6").exists()
    train(
        load_and_resolve(BASELINE, tiny_overrides(resumed, "train.max_steps=6"))
    )  # resumes from step3
    assert _losses(straight) == _losses(resumed)
    a, b = load_weights(straight / "step6"), load_weights(resumed / "step6")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


GLOO = ["train.max_steps=3", "run.save_interval=1000", "run.ephemeral_save_interval=null"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, demo_corpus):
    """The hourglass reference run in one process (bit-equal to a child: one thread each, see
    conftest)."""
    folder = tmp_path_factory.mktemp("one")
    train(load_and_resolve(BASELINE, tiny_overrides(folder, *GLOO, block="hourglass")))
    return folder


PARALLEL = ["fsdp", "hsdp", "ddp"]
BF16_PARALLEL = ["fsdp", "ddp"]  # FSDP2's bf16 policy (HSDP's is the same); DDP under bf16 autocast


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, demo_corpus):
    """The run on 2 ranks over gloo, as torchrun --nproc-per-node 2 starts it, once per
    data-parallel mode (conftest.train_each: forked ranks), each mode its own run and folder."""
    root = tmp_path_factory.mktemp("two")
    runs = [
        [
            str(BASELINE),
            *tiny_overrides(root / p, *GLOO, f"train.data_parallel={p}", block="hourglass"),
        ]
        for p in PARALLEL
    ]
    runs += [
        [
            str(BASELINE),
            *tiny_overrides(
                root / f"{p}-bf16",
                *GLOO,
                f"train.data_parallel={p}",
                "train.precision=bf16",
                block="hourglass",
            ),
        ]
        for p in BF16_PARALLEL
    ]
    return root, train_each(runs)


@pytest.mark.parametrize("parallel", PARALLEL)
def test_two_gloo_processes_match_one(two_ranks, one_process, parallel):
    """Two ranks over gloo (FSDP2 with one unit per hourglass block; HSDP, here one replica of 2
    shards; DDP) train as one process does: the same loss at every step."""
    root, r = two_ranks
    assert r.returncode == 0, r.stderr[-3000:]
    l1, l2 = _losses(one_process), _losses(root / parallel)
    assert sorted(l1) == sorted(l2) == [1, 2, 3]
    for step in l1:
        assert l1[step] == pytest.approx(l2[step], rel=1e-5), step
    assert json.loads((root / parallel / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3


@pytest.fixture(scope="module")
def one_process_bf16(tmp_path_factory, demo_corpus):
    folder = tmp_path_factory.mktemp("one-bf16")
    train(
        load_and_resolve(
            BASELINE, tiny_overrides(folder, *GLOO, "train.precision=bf16", block="hourglass")
        )
    )
    return folder


@pytest.mark.parametrize("parallel", BF16_PARALLEL)
def test_bf16_on_two_gloo_processes(two_ranks, one_process, one_process_bf16, parallel):
    """train.precision=bf16 over gloo: FSDP2 all-gathers bf16 copies of fp32 parameters and
    reduce-scatters fp32 gradients, DDP runs under bf16 autocast; both train as one bf16 process
    does (within 1e-4: FSDP rounds the weights where autocast rounds each matmul's inputs), not as
    fp32, and checkpoint fp32 weights."""
    root, r = two_ranks
    assert r.returncode == 0, r.stderr[-3000:]
    fp32, bf16, ranks = (
        _losses(one_process),
        _losses(one_process_bf16),
        _losses(root / f"{parallel}-bf16"),
    )
    assert sorted(ranks) == [1, 2, 3] and ranks != fp32
    for step in ranks:
        assert ranks[step] == pytest.approx(bf16[step], rel=1e-4), step
    assert {w.dtype for w in load_weights(root / f"{parallel}-bf16" / "step3").values()} == {
        torch.float32
    }


def test_mup_hidden_matrices_get_lr_over_m_width():
    """Variable-width muP: OLMo-core's optimizer puts every attention/FFN matrix at lr / m_width."""
    from olmo_core.optim import AdamWConfig

    from olmo_patches.config import vocab_size
    from olmo_patches.train.optimizer import optim_groups

    spec = load_and_resolve(
        REPO / "configs" / "paper2" / "200M" / "x.yaml", ["model.n_layers=4", "model.d_model=64"]
    )
    config = spec.model.build(vocab_size(spec))
    model = config.build(init_device="meta")
    optim = AdamWConfig(lr=spec.train.lr, group_overrides=optim_groups(spec, config)).build(model)
    lr_of = {id(p): g["lr"] for g in optim.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        hidden = p.ndim == 2 and (".attention.w_" in name or ".feed_forward.w" in name)
        expected = spec.train.lr / spec.model.widths.m_width if hidden else spec.train.lr
        assert lr_of[id(p)] == pytest.approx(expected), name
