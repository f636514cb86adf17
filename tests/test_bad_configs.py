"""Bad configs fail before any work: one line naming file, key and value; exit 2; nothing
written."""

from pathlib import Path

import pytest

from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import load_and_resolve

from .conftest import REPO, run_script

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"


def _variant(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "variant.yaml"
    path.write_text(f"extends: {BASELINE}\nrun:\n  save_folder: {tmp_path / 'run'}\n{body}")
    return path


CASES = [
    # (YAML body, the key the message must name, the value it must show)
    ("model:\n  depth: 3\n", "model.depth", "depth"),  # unknown key
    ("model:\n  d_model: wide\n", "model.d_model", "wide"),  # wrong type
    ("model:\n  block: hourglass\n  K: 0\n  d_h: 8\n", "model.K", "0"),
    ("model:\n  block: hourglass\n  K: 2\n  d_h: 0\n", "model.d_h", "0"),
    ("model:\n  n_heads: 5\n", "model.n_heads", "5"),  # 5 does not divide d_model 128
    ("model:\n  n_heads: 128\n", "model.n_heads", "128"),  # head_dim 1: RoPE needs it even
    ("model:\n  block: wide_narrow\n", "model.block", "wide_narrow"),
    ("train:\n  micro_batch_size: 3\n", "train.micro_batch_size", "3"),
    # the key that was set is blamed, not the one it resolves
    (
        "model:\n  block: hourglass\n  K: 2\n  d_h_ratio: 0.001\n",
        "model.d_h_ratio",
        "0.001",
    ),  # d_h = 0
    ("model:\n  d_ff: 10000000000\n", "model.d_ff", "10000000000"),  # a 128 x 1e10 FFN matrix
    (
        "model:\n  vocab_size: null\ndata:\n  demo_vocab_size: 10000000000\n",
        "data.demo_vocab_size",
        "10000000000",
    ),  # 1e10 x 128
]


@pytest.mark.parametrize("body,key,value", CASES)
def test_bad_config_names_file_key_and_value(tmp_path, body, key, value):
    path = _variant(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_and_resolve(path)
    message = str(e.value)
    assert "\n" not in message
    assert str(path) in message and key in message and value in message


def test_bad_override_names_the_command_line(tmp_path):
    with pytest.raises(ConfigError, match=r"command line: model\.K=-1"):
        load_and_resolve(BASELINE, ["model.block=hourglass", "model.K=-1", "model.d_h=8"])


def test_missing_base_file_is_named(tmp_path):
    path = tmp_path / "orphan.yaml"
    path.write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml: no such config file"):
        load_and_resolve(path)


@pytest.mark.parametrize("script", ["train.py", "count_params.py"])
def test_scripts_exit_2_and_write_nothing(tmp_path, script):
    path = _variant(tmp_path, "model:\n  block: hourglass\n  K: 0\n  d_h: 8\n")
    result = run_script(script, str(path), timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("config error")]
    assert len(errors) == 1 and "model.K=0" in errors[0] and str(path) in errors[0]
    assert result.stdout == ""
    assert not (tmp_path / "run").exists()


def test_interpolation_and_extends(tmp_path):
    spec = load_and_resolve(REPO / "configs" / "demo" / "hourglass.yaml")
    assert (
        spec.run.save_folder == "runs/demo/demo-hourglass"
    )  # ${run.name} resolved after the merge
    assert (spec.model.block, spec.model.K, spec.model.d_model) == ("hourglass", 8, 128)
