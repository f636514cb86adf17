"""data.mixture: named sources mixed by ratio through OLMo-core's source-mixture dataset and read in
the run's order by OLMo-core's data loader. Each source's tokens lie in its own id range, so every
instance names its source; the shares are checked against the ratios within sampling error, the
order against a rebuild with the same seed; the refusals are one line naming the key."""

import numpy as np
import pytest

from olmo_patches.config import ConfigError

from .conftest import REPO, run_in_process

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
SEQ, BATCH, STEPS = 16, 16, 375  # 6,000 instances of 16 tokens
RANGES = {"web": (2, 30), "code": (30, 60), "math": (60, 90)}  # each source's token ids; EOS is 0
FILES = {"web": [20_000] * 3, "code": [16_000] * 2, "math": [24_000]}  # tokens per file


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(0)
    for name, sizes in FILES.items():
        low, high = RANGES[name]
        for i, size in enumerate(sizes):
            tokens = rng.integers(low, high, size=size, dtype=np.uint8)
            tokens[rng.integers(0, size, size=size // 40)] = 0  # documents of ~40 tokens
            tokens[-1] = 0
            tokens.tofile(root / f"{name}-{i}.npy")
    return root


def _overrides(root, tmp_path, *extra, ratios=(5, 3, 2)):
    out = [
        "data.source=numpy",
        "data.demo_vocab_size=128",
        f"data.sequence_length={SEQ}",
        f"train.global_batch_size={BATCH}",
        "train.micro_batch_size=4",
        f"train.max_steps={STEPS}",
        "train.device=cpu",
        f"run.save_folder={tmp_path / 'run'}",
        f"data.work_dir={tmp_path / 'cache'}",
    ]
    for (name, sizes), ratio in zip(FILES.items(), ratios):
        out += [
            f"data.mixture.{name}.ratio={ratio}",
            f"data.mixture.{name}.paths=[{root}/{name}-*.npy]",
        ]
    return out + list(extra)


def _order(root, tmp_path, *extra, n=None):
    """The sources of the instances in the order the run's data loader reads them, and the
    instances."""
    from olmo_patches.launch.layout import Layout, load_and_resolve
    from olmo_patches.train.experiment import build_experiment
    from olmo_patches.train.sources import resolve_data

    spec = load_and_resolve(BASELINE, _overrides(root, tmp_path, *extra), Layout.plan(1, 1))
    exp = build_experiment(spec, resolve_data(spec))
    dataset = exp.dataset.build()
    dataset.prepare()
    loader = exp.data_loader.build(dataset, dp_process_group=None)
    loader.reshuffle(epoch=1)
    indices = loader.get_global_indices()[:n]
    instances = [dataset[int(i)]["input_ids"].numpy() for i in indices]
    names = []
    for x in instances:
        ids = x[x != 0]
        found = {
            name for name, (low, high) in RANGES.items() if ((ids >= low) & (ids < high)).all()
        }
        assert len(found) == 1, x  # an instance comes from one source's file
        names.append(found.pop())
    return names, instances


def test_shares_match_the_ratios_within_sampling_error(sources, tmp_path):
    names, _ = _order(sources, tmp_path)
    ratios = {"web": 0.5, "code": 0.3, "math": 0.2}  # 5 : 3 : 2, as given
    total = len(names)
    assert total == STEPS * BATCH
    for name, p in ratios.items():
        # the whole run: OLMo-core apportions instances per file (Hamilton), so within a few
        # instances
        assert abs(names.count(name) - p * total) <= 2 * len(FILES[name]), (name, names.count(name))
    n = 2000  # the first 2,000 instances of the shuffled order: a sample without replacement
    for name, p in ratios.items():
        share = names[:n].count(name) / n
        sigma = (p * (1 - p) / n) ** 0.5  # binomial; sampling without replacement is tighter
        assert abs(share - p) <= 4 * sigma, (name, share, p, 4 * sigma)


def test_the_same_seed_gives_the_same_order(sources, tmp_path):
    first_names, first = _order(sources, tmp_path / "a", n=600)
    again_names, again = _order(
        sources, tmp_path / "b", n=600
    )  # rebuilt from nothing (another cache)
    assert first_names == again_names and all(np.array_equal(x, y) for x, y in zip(first, again))
    other_names, other = _order(sources, tmp_path / "c", "data.order_seed=7", n=600)
    assert not all(np.array_equal(x, y) for x, y in zip(first, other))


def test_a_ratio_a_source_cannot_supply_is_refused(sources, tmp_path):
    from olmo_patches.config import load_spec
    from olmo_patches.train.sources import check_sources

    # math holds 24,000 tokens; 30% of 96,000 is 28,800: 1.2 passes
    spec = load_spec(BASELINE, _overrides(sources, tmp_path, ratios=(5, 2, 3)))
    with pytest.raises(
        ConfigError, match=r"^data.mixture.math.ratio: 0.3 of 96,000 tokens is 28,800, 1.20 passes"
    ):
        check_sources(spec)
    allowed = load_spec(
        BASELINE,
        _overrides(sources, tmp_path, "data.mixture.math.max_repetition=1.5", ratios=(5, 2, 3)),
    )
    rows = check_sources(allowed)
    assert [(s.name, s.tokens, needed) for s, needed, _ in rows] == [
        ("web", 60_000, 48_000),
        ("code", 32_000, 19_200),
        ("math", 24_000, 28_800),
    ]
    r = run_in_process(
        "train.py", str(BASELINE), *_overrides(sources, tmp_path, ratios=(5, 2, 3)), "--dry-run"
    )
    lines = r.stderr.strip().splitlines()
    assert (
        r.returncode == 2 and "data.mixture.math.ratio" in lines[-1] and "Traceback" not in r.stderr
    ), r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("ratios", [(0, 0, 0), (1, -1, 0)])
def test_ratios_that_do_not_sum_to_a_positive_number_are_refused(sources, tmp_path, ratios):
    from olmo_patches.config import load_spec

    with pytest.raises(ConfigError, match=r"^command line: data.mixture"):
        load_spec(BASELINE, _overrides(sources, tmp_path, ratios=ratios))


def test_the_dry_run_prints_each_source(sources, tmp_path):
    r = run_in_process("train.py", str(BASELINE), *_overrides(sources, tmp_path), "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    table = r.stdout[r.stdout.index("data.mixture") :]
    for name, tokens, ratio, read in (
        ("web", "60,000", "0.500", "48,000"),
        ("math", "24,000", "0.200", "19,200"),
    ):
        row = next(line for line in table.splitlines() if f" {name} " in line)
        assert tokens in row and ratio in row and read in row, row
    assert not (tmp_path / "run").exists()
