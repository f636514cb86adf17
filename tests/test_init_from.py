"""--init-from (train.init_from): a new run from another model's weights. The reference is a tiny
Hugging Face OLMo-2 model built here (transformers' Olmo2ForCausalLM): the new run's first loss is
that model's loss on the same batch, computed by transformers. The data is one global batch, so
every step reads the same four instances: a run started from another run's step-1 checkpoint has as
its first loss that run's step-2 loss. A bad target is one line, exit 2, nothing written."""

import json
import shutil

import numpy as np
import pytest
import torch

from .conftest import REPO, run_in_process

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
VOCAB, SEQ, BATCH = 256, 32, 4


def _hf_model(folder, d_model: int = 32):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(0)
    config = Olmo2Config(
        vocab_size=VOCAB,
        hidden_size=d_model,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500_000,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=0.3,  # far from uniform logits: a loss that only these weights give
        pad_token_id=1,
        eos_token_id=0,
        bos_token_id=None,
    )
    Olmo2ForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    root = tmp_path_factory.mktemp("init")
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, VOCAB, size=SEQ * BATCH).astype(np.uint8)  # one global batch of 4 x 32
    tokens[[40, 90, SEQ * BATCH - 1]] = 0  # EOS
    tokens.tofile(root / "batch.npy")
    return root, _hf_model(root / "hf"), _hf_model(root / "hf-wide", d_model=64)


def _overrides(root, save):
    return [
        "model.d_model=32",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.d_ff=64",
        f"model.vocab_size={VOCAB}",
        "model.norm_placement=post",  # OLMo-2's shape
        "model.qk_norm=true",
        "data.source=numpy",
        f"data.demo_vocab_size={VOCAB}",
        f"data.paths=[{root / 'batch.npy'}]",
        f"data.sequence_length={SEQ}",
        f"train.global_batch_size={BATCH}",
        f"train.micro_batch_size={BATCH}",
        "train.max_steps=2",
        "train.warmup_steps=1",
        "train.z_loss=null",  # the loss is the cross-entropy alone, as transformers computes it
        "run.save_interval=1",
        "run.log_interval=1",
        f"data.work_dir={root / 'cache'}",
        f"run.save_folder={save}",
    ]


def _losses(save):
    records = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records if "train/CE loss" in r}


def _train(root, save, *args):
    r = run_in_process("train.py", str(BASELINE), *_overrides(root, save), *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return _losses(save)


@pytest.fixture(scope="module")
def from_hf(place, tmp_path_factory):
    root, hf, _ = place
    save = tmp_path_factory.mktemp("runs") / "from-hf"
    return save, _train(root, save, "--init-from", str(hf))


@pytest.mark.slow
def test_the_first_loss_is_the_hf_models_loss_on_the_same_batch(place, from_hf):
    from transformers import AutoModelForCausalLM

    root, hf, _ = place
    _, losses = from_hf
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    batch = torch.from_numpy(np.fromfile(root / "batch.npy", dtype=np.uint8).astype(np.int64)).view(
        BATCH, SEQ
    )
    with torch.no_grad():
        reference = model(input_ids=batch, labels=batch).loss.item()
    assert abs(reference - np.log(VOCAB)) > 0.1  # not the loss any small initialization gives
    assert abs(losses[1]["train/CE loss"] - reference) < 1e-4, (
        losses[1]["train/CE loss"],
        reference,
    )


@pytest.mark.slow
def test_a_run_checkpoint_of_the_same_shape_starts_a_fresh_run(place, from_hf, tmp_path):
    root, _, _ = place
    source, first = from_hf
    losses = _train(root, tmp_path / "next", "--init-from", str(source / "step1"))
    # step 1 here reads the weights after the source run's step 1, on the same batch: its step-2
    # loss
    assert abs(losses[1]["train/CE loss"] - first[2]["train/CE loss"]) < 1e-5
    # a fresh schedule: the warmup's learning rate again, not the source run's step-2 rate
    assert (
        losses[1]["optim/LR (group 0)"]
        == first[1]["optim/LR (group 0)"]
        != first[2]["optim/LR (group 0)"]
    )
    assert (tmp_path / "next" / "step2").is_dir() and not (
        tmp_path / "next" / "superseded"
    ).exists()


def _corrupt_checkpoint(source, tmp_path):
    copy = tmp_path / "corrupt"
    shutil.copytree(source / "step1", copy)
    shard = sorted((copy / "model_and_optim").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return copy


def _cut_hf(hf, tmp_path):
    copy = tmp_path / "cut-hf"
    shutil.copytree(hf, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return copy


def _gpt2(tmp_path):
    """A Hugging Face folder of another architecture: its config.json names it."""
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return tmp_path / "gpt2"


BAD = [
    (
        "wide",
        lambda place, run, tmp: place[2],
        "first differing weight embeddings.weight: [256, 64] there, [256, 32]",
    ),
    ("missing", lambda place, run, tmp: tmp / "nothing-here", "no such folder"),
    ("gpt2", lambda place, run, tmp: _gpt2(tmp), "a Hugging Face gpt2 model, not an OLMo-2 one"),
    ("corrupt", lambda place, run, tmp: _corrupt_checkpoint(run, tmp), "is corrupted (CRC-32"),
    ("cut-hf", lambda place, run, tmp: _cut_hf(place[1], tmp), "unreadable Hugging Face model"),
]


@pytest.mark.parametrize("name,target,why", BAD, ids=[b[0] for b in BAD])
def test_a_bad_target_is_one_line_and_nothing_written(place, from_hf, tmp_path, name, target, why):
    root = place[0]
    path = target(place, from_hf[0], tmp_path)
    save = tmp_path / "run"
    r = run_in_process("train.py", str(BASELINE), *_overrides(root, save), "--init-from", str(path))
    lines = r.stderr.strip().splitlines()  # transformers' own bars and warnings not among them
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert f"train.init_from={path}" in lines[-1] and why in lines[-1], lines[-1]
    assert not save.exists()


@pytest.mark.slow
def test_this_projects_olmo2_shaped_export_starts_a_run(place, from_hf, tmp_path):
    """A baseline of OLMo-2's shape exports as transformers' Olmo2ForCausalLM (export/hf.py); a run
    from that folder starts at the exported model's transformers loss."""
    from transformers import AutoModelForCausalLM

    root = place[0]
    source, _ = from_hf
    r = run_in_process("export_hf.py", str(source / "step2"), str(tmp_path / "export"))
    assert r.returncode == 0, r.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    assert type(model).__name__ == "Olmo2ForCausalLM"
    batch = torch.from_numpy(np.fromfile(root / "batch.npy", dtype=np.uint8).astype(np.int64)).view(
        BATCH, SEQ
    )
    with torch.no_grad():
        reference = model(input_ids=batch, labels=batch).loss.item()
    losses = _train(root, tmp_path / "from-export", "--init-from", str(tmp_path / "export"))
    assert abs(losses[1]["train/CE loss"] - reference) < 1e-4, (
        losses[1]["train/CE loss"],
        reference,
    )
