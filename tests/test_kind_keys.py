"""A block kind owns its model keys: a config of one kind cannot set another's (one line naming the
kinds that read it), and a kind of your own adds keys from its own file. A run folder recorded
before the kinds owned their keys (tests/records/: the full dumps an earlier version wrote, every
kind's knob in one flat model section) is of an earlier layout: a start refuses it in one line;
the shipped configs build the models they built then."""

from dataclasses import dataclass

import pytest

from olmo_patches.blocks import BLOCKS, BlockKind
from olmo_patches.blocks.base import ModelSpec
from olmo_patches.config import ConfigError, load_spec
from olmo_patches.launch.run_folder import changed_keys, earlier_layout
from olmo_patches.report.counts import count

from .conftest import REPO, TINY, run_in_process

DEMO = REPO / "configs" / "demo"
RECORDS = REPO / "tests" / "records"

# Non-embedding parameters of each shipped config as the earlier version counted them
# (count_params --json at the commit that wrote tests/records/): the model must not change.
BEFORE = {
    "demo/baseline": 1_048_576,
    "demo/hourglass": 1_048_576,
    "demo/variable-width": 1_110_016,
    "113M/hourglass-K8-dh384": 113_246_208,
    "paper2/3B-MoE/x-hourglass-experts": 2_614_350_848,
    "paper2/500M/x-learned": 361_168_896,
}


# The records of the earlier layout: the first key of another kind in each (a variable-width
# record held only its own kind's keys: it is of this layout and resumes).
FOREIGN = {"demo/baseline": "model.K", "demo/hourglass": "model.ffn"}
FOREIGN["113M/hourglass-K8-dh384"] = "model.ffn"


@pytest.mark.parametrize("name", BEFORE)
def test_a_shipped_config_builds_its_model_and_an_earlier_record_is_refused(name):
    record = (RECORDS / (name.replace("/", "-") + ".yaml")).read_text()
    shipped = load_spec(REPO / "configs" / f"{name}.yaml")
    assert count(shipped).non_embedding == BEFORE[name]
    if name in FOREIGN:
        assert earlier_layout(record) == f"{FOREIGN[name]}: not a key now"
    else:
        assert earlier_layout(record) is None and changed_keys(record, shipped) == []


@pytest.mark.parametrize(
    "config, override, line",
    [
        (
            "baseline",
            "model.K=2",
            "config error: command line: model.K: a key of model.block=hourglass or "
            "variable_width, not of model.block=baseline",
        ),
        (
            "hourglass",
            "model.widths.shape=v",
            "config error: command line: model.widths: a key of model.block=variable_width, "
            "not of model.block=hourglass",
        ),
        (
            "baseline",
            "model.moe.num_experts=4",
            "config error: command line: model.moe: a key of model.block=variable_width, "
            "not of model.block=baseline",
        ),
        (
            "variable-width",
            "model.K=2",
            "config error: command line: model.K=2: read only with model.ffn=hourglass or "
            "model.moe.experts=hourglass",
        ),
    ],
)
def test_another_kinds_key_is_refused_in_one_line(config, override, line):
    r = run_in_process("count_params.py", str(DEMO / f"{config}.yaml"), override)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [line], r.stderr


def test_another_kinds_key_at_its_default_means_nothing():
    """K=1 on a baseline: another kind's key at its default is no key of it, the model unchanged."""
    spec = load_spec(DEMO / "baseline.yaml", ["model.K=1", "model.ffn=swiglu"])
    assert type(spec.model) is ModelSpec and not hasattr(spec.model, "K")
    assert count(spec).non_embedding == BEFORE["demo/baseline"]


@dataclass
class WideModel(ModelSpec):
    ffn_mult: int = 4  # the FFN's hidden size is ffn_mult d_model


class Wide(BlockKind):
    name = "wide_test"
    spec = WideModel

    def check(self, m, fail):
        if m.ffn_mult < 1:
            fail("model.ffn_mult", m.ffn_mult, "must be >= 1")

    def build(self, m, config):
        config.block.feed_forward.hidden_size = m.ffn_mult * m.d_model
        return config


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setitem(BLOCKS, Wide.name, Wide())


def test_a_kind_of_your_own_adds_its_keys_from_its_own_file(wide):
    """Its key loads, is checked by it, and builds; every other kind refuses it."""
    spec = load_spec(DEMO / "baseline.yaml", [*TINY, "model.block=wide_test", "model.ffn_mult=8"])
    assert spec.model.ffn_mult == 8
    d, L = 32, 2
    assert count(spec).ffn == 3 * d * 8 * d * L  # SwiGLU: three d x 8d matrices a layer
    with pytest.raises(ConfigError, match=r"model.ffn_mult=0: must be >= 1$"):
        load_spec(DEMO / "baseline.yaml", [*TINY, "model.block=wide_test", "model.ffn_mult=0"])
    with pytest.raises(ConfigError) as e:
        load_spec(DEMO / "hourglass.yaml", ["model.ffn_mult=8"])
    assert str(e.value) == (
        "command line: model.ffn_mult: a key of model.block=wide_test, not of model.block=hourglass"
    )
