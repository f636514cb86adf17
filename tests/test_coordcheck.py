"""The coordinate check (train/coordcheck.py, scripts/coordcheck.py) on paper 2's variable-width
model at tiny widths: flat under its muP (model.widths.init=mup), growing under the standard
parametrisation (init=olmo), and growing again when muP's per-width LR is broken."""

import json

import pytest

import olmo_patches.train.optimizer as optimizer_module
from olmo_patches.train.coordcheck import coord_check

from .conftest import REPO, run_in_process

CONFIG = str(REPO / "configs" / "demo" / "variable-width.yaml")
TINY = ["model.d_model=32", "model.n_layers=4"]  # widths 32, 64, 128 (schedule multiple 16)


def _check(init):
    return coord_check(
        CONFIG,
        [*TINY, f"model.widths.init={init}"],
        ["width"],
        steps=8,
        batch=4,
        seq=32,
        say=lambda *_: None,
    )


def _last(check, kind):
    return [check.scales["width"][m][-1][kind] for m in (1, 2, 4)]


def test_mup_is_flat_in_width():
    check = _check("mup")
    assert not check.grows("width"), check.verdict("width")
    for kind in ("attention", "ffn", "block"):
        x1, _, x4 = _last(check, kind)
        assert x4 < 1.32 * x1, (kind, _last(check, kind))  # 4^0.2: FLAT's bound, written out
    assert check.summary().startswith("muP-like")


def test_standard_parametrisation_grows_with_width():
    check = _check("olmo")
    assert check.grows("width"), check.verdict("width")
    x1, x2, x4 = _last(check, "ffn")
    assert x1 < x2 < x4 and x4 > 2 * x1, _last(
        check, "ffn"
    )  # Adam's update of a hidden sum grows ~ width
    assert check.summary().startswith("standard-parametrisation-like")


def test_broken_mup_learning_rate_grows(monkeypatch):
    """muP without its hidden LR / m_width (every matrix at the base LR): the check must see it."""
    groups = optimizer_module.optim_groups
    monkeypatch.setattr(
        optimizer_module,
        "optim_groups",
        lambda spec, model: [g for g in groups(spec, model) if "lr" not in g.opts],
    )
    check = _check("mup")
    assert check.grows("width"), check.verdict("width")


def test_command_writes_json_and_plot_and_says_which(tmp_path):
    out = tmp_path / "cc"
    r = run_in_process(
        "coordcheck.py",
        CONFIG,
        *TINY,
        "model.widths.init=olmo",
        "--axes",
        "width,depth",
        "--steps",
        "4",
        "--batch",
        "2",
        "--seq",
        "16",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "\nstandard-parametrisation-like: activations grow with the width" in r.stdout, r.stdout
    data = json.loads((out / "coordcheck.json").read_text())
    assert set(data["axes"]) == {"width", "depth"}
    runs = data["axes"]["depth"]["runs"]
    assert runs["4"]["overrides"] == ["model.n_layers=16"] and len(runs["4"]["scales"]) == 4
    assert set(runs["1"]["scales"][0]) == {"embedding", "attention", "ffn", "block", "logits"}
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
