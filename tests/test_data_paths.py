"""The data paths through OLMo-core's Trainer (in process, tiny model): data.source=olmo2_stage1
from a loopback HTTP mirror of the pinned list, a named OLMo-core data.mix, and OLMo-2's repetition
filter.

Each test trains a few steps with train() and records, from inside the Trainer (an OLMo-core
callback), the batches its data loader yields and the metrics it logs. The references are written
here in numpy and plain PyTorch from the documented rules (the order: the OLMo-2 recipe,
docs/papers.md and docs/data_order.md; the filter: OLMo-2's repetition rule; the loss: OLMo-core's
masking), not taken from olmo_patches.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from olmo_core.train.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _http_server import FileServer  # noqa: E402

from olmo_patches.launch.layout import load_and_resolve  # noqa: E402
from olmo_patches.train import train  # noqa: E402

from .conftest import REPO, tiny_overrides  # noqa: E402

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
PINNED = (
    REPO / "data_order" / "olmo2-1b-stage1.txt"
)  # read as data: its relative paths lay out the mirror
ORIGIN = "http://olmo-data.org/"
# The old trainer shuffles arange(N, uint32) with PCG64(6198 + epoch 0); OLMo-core's loader, given
# seed 6197, with PCG64(6197 + epoch 1): the same generator (the OLMo-2 recipe, docs/papers.md).
ORDER_PCG64_SEED = 6198
SEQ = 32  # TINY's data.sequence_length
BATCH = 4  # TINY's train.global_batch_size
DOLMA2_VOCAB = 100_278  # dolma2's tokens; every synthetic id is below it
# The demo config pins the demo's vocabulary; no z-loss (a second pass over dolma2's 100k logits,
# not tested here).
DOLMA2 = ["data.tokenizer=dolma2", "model.vocab_size=null", "train.z_loss=null"]
# OLMo-core's OLMoE-mix-0824-dev (olmo_core/data/mixes/OLMoE-mix-0824-dev.txt): four sources, one
# file each, in this order; {TOKENIZER} is dolma2's "allenai/dolma2-tokenizer". Instances given to
# each.
MIX = "OLMoE-mix-0824-dev"
MIX_FILES = {
    "preprocessed/proof-pile-2/v0_decontaminated/algebraic-stack/train/"
    "allenai/dolma2-tokenizer/part-00-00000.npy": 6,
    "preprocessed/starcoder/v1-decon-100_to_20k-2star-top_token_030/"
    "allenai/dolma2-tokenizer/part-099-00000.npy": 3,
    "preprocessed/dclm/text_openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train/"
    "allenai/dolma2-tokenizer/part-000-00000.npy": 2,
    "preprocessed/olmo-mix/danyh-compiled-v1_7/documents/wiki/"
    "allenai/dolma2-tokenizer/part-1-00000.npy": 1,
}


@dataclass
class Probe(Callback):
    """Records, inside the Trainer, each step's batch as the data loader yields it and the logged
    metrics; ``reference(model, batch)``, if given, is computed before the step (the weights the
    loss is taken at)."""

    reference: Optional[Callable[[torch.nn.Module, Dict[str, Any]], torch.Tensor]] = None
    batches: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    refs: Dict[int, torch.Tensor] = field(default_factory=dict)
    metrics: Dict[int, Dict[str, float]] = field(default_factory=dict)

    def pre_step(self, batch: Dict[str, Any]):
        self.batches[self.step] = {
            k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()
        }
        if self.reference is not None:
            with torch.no_grad():
                self.refs[self.step] = self.reference(self.trainer.train_module.model, batch)

    def log_metrics(self, step: int, metrics: Dict[str, float]):
        self.metrics.setdefault(step, {}).update(metrics)


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, DOLMA2_VOCAB, size=n, dtype=np.uint32)


def _ordered(files: Dict[str, bytes], listed: list[str]):
    """The reference order over ``listed`` (raw uint32 files, each cut into SEQ-token instances, its
    remainder dropped, instances numbered file after file): (shuffled global ids, ids -> tokens,
    file of each id)."""
    arrays = [np.frombuffer(files[name], dtype=np.uint32) for name in listed]
    counts = [len(a) // SEQ for a in arrays]
    instances = np.concatenate([a[: c * SEQ].reshape(c, SEQ) for a, c in zip(arrays, counts)])
    file_of = np.repeat(np.arange(len(listed)), counts)
    order = np.arange(len(instances), dtype=np.uint32)
    np.random.Generator(np.random.PCG64(ORDER_PCG64_SEED)).shuffle(order)
    return order, instances, file_of


@pytest.fixture(scope="module")
def mirror():
    """A loopback HTTP server holding every file of the pinned list under its relative path: 0-2
    instances of SEQ tokens each plus a remainder, and the mix's four files with MIX_FILES
    instances."""
    rng = np.random.default_rng(18)
    names = list(dict.fromkeys(line.removeprefix(ORIGIN) for line in PINNED.read_text().split()))
    files = {name: _tokens(rng, (i % 3) * SEQ + i % 7).tobytes() for i, name in enumerate(names)}
    assert set(MIX_FILES) <= set(files)  # the dev mix's files are Stage 1 files
    files.update({name: _tokens(rng, n * SEQ + 5).tobytes() for name, n in MIX_FILES.items()})
    with FileServer(files) as server:
        yield server, files


def _check_batches(probe: Probe, order: np.ndarray, instances: np.ndarray, steps: int) -> None:
    assert sorted(probe.batches) == list(range(1, steps + 1))
    for step, batch in probe.batches.items():
        ids = order[(step - 1) * BATCH : step * BATCH]
        np.testing.assert_array_equal(batch["index"].numpy(), ids)
        np.testing.assert_array_equal(batch["input_ids"].numpy(), instances[ids])
        assert np.isfinite(probe.metrics[step]["train/CE loss"])


def test_olmo2_stage1_from_an_http_mirror_through_the_trainer(tmp_path, mirror):
    """data.source=olmo2_stage1 with data.base on a loopback mirror: the real pinned list (its
    checksum checked as in production), 1122 entries with its five repeated files; the Trainer's
    first two batches are the reference order's instances, read over HTTP."""
    server, files = mirror
    listed = [line.removeprefix(ORIGIN) for line in PINNED.read_text().split()]
    assert len(listed) == 1122 and len(set(listed)) == 1117
    order, instances, file_of = _ordered(files, listed)
    probe = Probe()
    spec = load_and_resolve(
        BASELINE,
        tiny_overrides(
            tmp_path,
            "data.source=olmo2_stage1",
            f"data.base={server.base_url}/",
            *DOLMA2,
            "train.max_steps=2",
        ),
    )
    train(spec, callbacks={"probe": probe})
    _check_batches(probe, order, instances, steps=2)
    read = {name for method, name, rng in server.requests if method == "GET" and rng}
    assert {
        listed[f] for f in file_of[order[: 2 * BATCH]]
    } <= read  # each batch's files, by Range GETs


def test_named_data_mix_trains_on_each_source_in_proportion(tmp_path, mirror):
    """data.source=numpy with data.mix (an OLMo-core DataMix) and data.mix_base_dir: over one epoch
    (3 steps of 4 of the 12 instances) the Trainer sees each source's instances exactly once, in the
    reference order: 6, 3, 2 and 1 of 12, the mix's files' sizes."""
    server, files = mirror
    listed = list(MIX_FILES)
    order, instances, file_of = _ordered(files, listed)
    assert len(order) == 12
    probe = Probe()
    spec = load_and_resolve(
        BASELINE,
        tiny_overrides(
            tmp_path,
            "data.source=numpy",
            f"data.mix={MIX}",
            f"data.mix_base_dir={server.base_url}",
            *DOLMA2,
            "train.max_steps=3",
        ),
    )
    train(spec, callbacks={"probe": probe})
    _check_batches(probe, order, instances, steps=3)
    seen = np.concatenate([b["index"].numpy() for b in probe.batches.values()])
    assert sorted(seen) == list(range(12))
    assert np.bincount(file_of[seen], minlength=4).tolist() == [6, 3, 2, 1]


# -- OLMo-2's repetition filter --------------------------------------------------------------------

FILTER_SEQ = 64
MAX_PERIOD, MAX_COUNT = (
    13,
    32,
)  # OLMo-2 Stage 1: an n-gram of period 1..13 repeated 32 times or more


def repeats(x: np.ndarray, period: int) -> int:
    """The most consecutive repetitions of any ``period``-token n-gram in ``x``: the longest run of
    x[j] == x[j + period], plus the period, in whole periods."""
    run = best = 0
    for same in x[:-period] == x[period:]:
        run = run + 1 if same else 0
        best = max(best, run)
    return (best + period) // period


def filtered(x: np.ndarray) -> bool:
    return any(repeats(x, p) >= MAX_COUNT for p in range(1, MAX_PERIOD + 1))


def _filter_corpus(rng: np.random.Generator) -> list[np.ndarray]:
    """Eight instances of FILTER_SEQ tokens: four degenerate, four clean (two of those just
    short)."""

    def pattern(gram: np.ndarray, times: int, at: int) -> np.ndarray:
        x = _tokens(rng, FILTER_SEQ)
        x[at : at + len(gram) * times] = np.tile(gram, times)
        return x

    g = [_tokens(rng, p) for p in (1, 2, 3, 5)]
    return [
        pattern(g[0], 40, 10),  # one token 40 times: filtered
        pattern(g[0], 31, 20),  # 31 times: kept
        pattern(g[1], 32, 0),  # a bigram 32 times, the whole instance: filtered
        pattern(g[2], 21, 1),  # a trigram 21 times (63 tokens): kept
        pattern(g[0], 32, 32),  # one token 32 times at the end: filtered
        pattern(g[3], 12, 3),  # a 5-gram 12 times: kept
        _tokens(rng, FILTER_SEQ),
        np.tile(g[0], FILTER_SEQ),  # one token throughout: filtered
    ]


def _ce_sum(model, batch) -> torch.Tensor:
    """Per instance, the summed next-token cross-entropy of the model on it (summed in float64)."""
    ids = batch["input_ids"]
    return (
        F.cross_entropy(model(ids)[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        .double()
        .sum(dim=1)
    )


def test_repetition_filter_masks_the_loss_inside_a_training_run(tmp_path):
    """data.instance_filter=true: in the Trainer's batch (the whole 8-instance corpus) exactly the
    instances the rule flags carry instance_mask False, and the step's CE loss is OLMo-core's masked
    loss computed here: the kept instances' summed cross-entropy over all the batch's label tokens,
    a masked instance counting FILTER_SEQ tokens of zero loss (olmo_core
    train_module.train_batch)."""
    corpus = _filter_corpus(np.random.default_rng(2))
    expected = np.array([filtered(x) for x in corpus])
    assert expected.tolist() == [True, False, True, False, True, False, False, True]
    path = tmp_path / "corpus.npy"
    np.concatenate(corpus).tofile(path)
    probe = Probe(reference=_ce_sum)
    spec = load_and_resolve(
        BASELINE,
        tiny_overrides(
            tmp_path / "run",
            "data.source=numpy",
            f"data.paths=[{path}]",
            *DOLMA2,
            "data.instance_filter=true",
            f"data.sequence_length={FILTER_SEQ}",
            "train.global_batch_size=8",
            "train.micro_batch_size=4",
            "train.max_steps=1",
        ),
    )
    train(spec, callbacks={"probe": probe})

    batch = probe.batches[1]
    index = batch["index"].numpy()
    assert sorted(index) == list(range(8))
    np.testing.assert_array_equal(batch["input_ids"].numpy(), np.stack(corpus)[index])
    kept = batch["instance_mask"].numpy()
    np.testing.assert_array_equal(~kept, expected[index])
    np.testing.assert_array_equal(~kept, [filtered(x) for x in batch["input_ids"].numpy()])

    ce = probe.refs[1]
    n_kept = int(kept.sum())
    loss = ce[torch.from_numpy(kept)].sum() / (
        n_kept * (FILTER_SEQ - 1) + (8 - n_kept) * FILTER_SEQ
    )
    unmasked = ce.sum() / (8 * (FILTER_SEQ - 1))
    metrics = probe.metrics[1]
    assert metrics["train/CE loss"] == pytest.approx(float(loss), rel=1e-5)
    assert abs(float(unmasked) - float(loss)) > 1.0  # the masking is visible in the loss
    assert metrics["train/masked instances (%)"] == pytest.approx(0.5)
