"""The coordinate check (train/coordcheck.py, scripts/coordcheck.py) used as it is used: paper 2's
variable-width model at widths x1..x8 (d_model 16..128, d_head 8..64) under its muP and under the
standard parametrisation, each described as it is, and with its muP broken on purpose in one place
at a time (learning rate, readout, attention scale, init), each flagged and named."""

import json
import math

import pytest
import torch

import olmo_patches.train.coordcheck as coordcheck
import olmo_patches.train.optimizer as optimizer_module

from .conftest import REPO, run_in_process

CONFIG = str(REPO / "configs" / "demo" / "variable-width.yaml")
TINY = [
    "model.d_model=16",
    "model.n_layers=3",
    "model.n_heads=2",
    "model.widths.schedule=list",
    "model.widths.values=[16,8,16]",  # the x shape; x8: [128,64,128]
    "model.vocab_size=null",  # the tokenizer's, padded (4096), as most configs leave it
]


def _check(init="mup"):
    return coordcheck.coord_check(
        CONFIG, [*TINY, f"model.widths.init={init}"], steps=3, seeds=2, say=lambda *_: None
    )


def test_mup_is_in_scale():
    check = _check()
    assert check.causes("width") == {}, check.summary()
    assert check.summary().startswith("muP-like")
    # the readout's init: logits / m_width of a d_model-sum of independent terms, sqrt(d) / d
    assert check.judged("width")["logits"]["init"] == pytest.approx(-0.5, abs=0.1)


def test_standard_parametrisation_grows_at_init_and_in_its_updates():
    check = _check("olmo")
    judged, causes = check.judged("width"), check.causes("width")
    for kind in ("attention", "ffn"):  # a fixed init std: a d-sum grows at init
        assert judged[kind]["init"] > 0.5 and causes[kind].startswith("init/multiplier")
    for kind in ("block", "logits"):  # one LR for every width: Adam's update of a d-sum grows
        assert (
            judged[kind]["update"] > judged[kind]["init"] + 0.25 and "learning rate" in causes[kind]
        )
    assert check.summary().startswith("not muP in width"), check.summary()


def _hidden_lr_unscaled(monkeypatch):
    """Every matrix at the base LR: muP's hidden lr / m_width dropped."""
    groups = optimizer_module.optim_groups
    monkeypatch.setattr(
        optimizer_module,
        "optim_groups",
        lambda spec, model: [g for g in groups(spec, model) if "lr" not in g.opts],
    )


def _edit_model(monkeypatch, edit):
    build = coordcheck._model

    def broken(spec, seed):
        model, optim = build(spec, seed)
        with torch.no_grad():
            edit(model, spec.model.widths.m_width)
        return model, optim

    monkeypatch.setattr(coordcheck, "_model", broken)


def _readout_unscaled(model, m_width):  # logits x 1 instead of x 1 / m_width
    model.lm_head.norm.logit_scale = 1.0


def _attention_scale_sqrt(model, m_width):  # q.k / sqrt(d_head) instead of / d_head
    for block in model.blocks.values():
        block.attention.backend.scale = None


def _hidden_init_unscaled(model, m_width):  # hidden std without its 1 / sqrt(m_width)
    for p in model.blocks.parameters():
        if p.dim() >= 2:
            p.mul_(math.sqrt(m_width))


@pytest.mark.parametrize(
    "edit,expected",
    [
        (None, {"attention": "learning rate", "ffn": "learning rate"}),
        (_readout_unscaled, {"logits": "init/multiplier"}),
        (_attention_scale_sqrt, {"attention logits": "init/multiplier"}),
        (_hidden_init_unscaled, {"attention": "init/multiplier", "ffn": "init/multiplier"}),
    ],
    ids=["learning-rate", "readout", "attention-scale", "init"],
)
def test_broken_mup_is_flagged_where_it_is_broken(monkeypatch, edit, expected):
    if edit is None:
        _hidden_lr_unscaled(monkeypatch)
    else:
        _edit_model(monkeypatch, edit)
    check = _check()
    causes = check.causes("width")
    assert {k: causes.get(k) for k in expected} == expected, check.summary()
    assert "logits" in expected or "logits" not in causes, check.summary()  # readout untouched
    assert check.summary().startswith("not muP in width")


@pytest.mark.slow
def test_command_writes_json_and_plot_and_says_which(tmp_path):
    out = tmp_path / "cc"
    args = ["--steps", "2", "--seeds", "1", "--out", str(out)]
    r = run_in_process("coordcheck.py", CONFIG, *TINY, "model.widths.init=olmo", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("width x1:") and "\nnot muP in width" in r.stdout, r.stdout
    data = json.loads((out / "coordcheck.json").read_text())
    assert set(data["axes"]) == {"width"} and data["multipliers"] == [1, 2, 4, 8]
    width = data["axes"]["width"]
    assert width["overrides"][3][:2] == ["model.d_model=128", "model.widths.values=[128,64,128]"]
    assert set(width["scales"]) == set(coordcheck.GROUPS)
    assert len(width["scales"]["ffn"][0][0]) == 3  # init, then 2 steps of updates, per seed
    assert (out / "coordcheck.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "args,named",
    [
        (
            ["--axes", "K"],
            "K is not an axis of model.block=variable_width (its axes: width, depth)",
        ),
        (["--axes", "width,nope"], "--axes"),
        (["--steps", "0"], "--steps"),
    ],
)
def test_bad_arguments(tmp_path, args, named):
    r = run_in_process("coordcheck.py", CONFIG, *args, "--out", str(tmp_path / "cc"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and named in lines[0], r.stderr
    assert not (tmp_path / "cc").exists()
