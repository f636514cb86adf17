"""validate()'s checks that no other test reaches: each bad value, given on the command line, fails
at load in one line naming where the key was set (the command line, or the file when the problem is
a value the file left in place), the key and the value."""

import sys

import pytest

from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import load_and_resolve

from .conftest import REPO

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
HOURGLASS = ["model.block=hourglass", "model.K=2"]
VW = ["model.block=variable_width", "model.widths.schedule=list", "model.n_layers=2"]

CASES = [
    # (overrides, the key the message names, the value it shows, a word of the reason)
    (HOURGLASS, "model.d_h", "None", "give d_h or d_h_ratio"),  # K > 1 without d_h
    ([*HOURGLASS, "model.d_h=16", "model.d_h_ratio=0.5"], "model.d_h_ratio", "0.5", "not both"),
    ([*HOURGLASS, "model.d_h_ratio=-0.5"], "model.d_h_ratio", "-0.5", "> 0"),
    (["model.norm_placement=middle"], "model.norm_placement", "middle", "choose one of pre, post"),
    (["model.ffn_ratio=0"], "model.ffn_ratio", "0", ">= 1"),
    (
        ["train.max_tokens=1000"],
        "train.max_tokens",
        "1000",
        "exactly one",
    ),  # the command line's key is blamed
    (["train.warmup_tokens=64"], "train.warmup_tokens", "64", "not both"),
    (["train.precision=fp16"], "train.precision", "fp16", "choose one of bf16, fp32"),
    (
        ["train.data_parallel=zero3"],
        "train.data_parallel",
        "zero3",
        "choose one of fsdp, hsdp, ddp",
    ),
    (["train.device=tpu"], "train.device", "tpu", "choose one of auto, cpu, cuda"),
    (["data.source=web"], "data.source", "web", "choose one of demo, olmo2_stage1, prefix, numpy"),
    (
        ["data.source=prefix", "data.tokenizer=dolma2"],
        "data.prefix_dir",
        "None",
        "materialized folder",
    ),
    (
        ["data.source=numpy", "data.tokenizer=dolma2"],
        "data.source",
        "numpy",
        "data.paths, data.mix or data.mixture",
    ),
    (["data.tokenizer=gpt2"], "data.tokenizer", "gpt2", "choose one of demo, dolma2"),
    (
        ["data.tokenizer=dolma2"],
        "data.tokenizer",
        "dolma2",
        "tokenized with demo",
    ),  # source/tokenizer mismatch
    (["data.sequence_length=1"], "data.sequence_length", "1", ">= 2"),
    (
        ["eval.validation_sets=[wikitext_104]"],
        "eval.validation_sets",
        "['wikitext_104']",
        "unknown",
    ),
    (
        ["eval.downstream_tasks=[arc_hardest]"],
        "eval.downstream_tasks",
        "['arc_hardest']",
        "ai2-olmo-eval task",
    ),
    ([*VW, "model.widths.values=[32]"], "model.widths.values", "[32]", "n_layers=2"),
    (
        [*VW, "model.widths.values=[32,32]", "model.widths.init=xavier"],
        "model.widths.init",
        "xavier",
        "choose one of olmo, mup",
    ),
    (
        [*VW, "model.widths.values=[32,32]", "model.ffn=moe"],
        "model.ffn",
        "moe",
        "choose one of swiglu, hourglass",
    ),
    (
        [*VW, "model.widths.values=[32,32]", "model.tie_embeddings=true"],
        "model.tie_embeddings",
        "True",
        "untied",
    ),
]


@pytest.mark.parametrize("overrides,key,value,why", CASES, ids=[c[1] + ":" + c[3] for c in CASES])
def test_bad_value_fails_at_load_in_one_line(overrides, key, value, why):
    with pytest.raises(ConfigError) as err:
        load_and_resolve(BASELINE, overrides)
    message = str(err.value)
    source, _, rest = message.partition(": ")
    assert source in ("command line", str(BASELINE)) and rest.startswith(f"{key}={value}: "), (
        message
    )
    assert why in rest and "\n" not in message, message


def test_downstream_tasks_without_ai2_olmo_eval_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "olmo_eval", None)  # an install without the eval extra
    with pytest.raises(ConfigError, match=r"needs ai2-olmo-eval, the eval extra") as err:
        load_and_resolve(BASELINE, ["eval.downstream_tasks=[arc_easy]"])
    assert str(err.value).startswith("command line: eval.downstream_tasks=['arc_easy']: ")
