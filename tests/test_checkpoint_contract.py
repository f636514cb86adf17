"""A checkpoint against a config: every command that takes both refuses another model's checkpoint
in one line (exit 2, nothing written) naming the first differing weight, both shapes and the config
the checkpoint was written with, and accepts its own. The matrix: checkpoints of the demo's three
blocks (baseline, hourglass, variable width; tiny) against the same three configs, for train
--resume-from, evaluate, export_hf and analyze (verify_checkpoints takes no config). Also: export_hf
into a folder that is not empty, evaluate's --out and --device, analyze's --out.

The reference shapes are the papers' FFN equations at the tiny sizes: SwiGLU's W_1 is (4 d_model,
d_model) (hidden 4 d_model, configs/demo/baseline.yaml), the hourglass's first K sub-MLPs' input
projection (K d_h, d_model) (paper 1, Section 3)."""

import itertools
import shutil
import sys

import pytest

from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train

from .conftest import REPO, run, run_in_process, run_script, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

DEMO = REPO / "configs" / "demo"
BLOCKS = {  # name: (demo config, overrides beyond TINY)
    "baseline": ("baseline.yaml", []),
    "hourglass": ("hourglass.yaml", []),  # tiny_overrides' K=2, d_h=16
    "variable-width": ("variable-width.yaml", ["model.n_layers=4"]),  # its x shape needs 1 < k < L
}
D_MODEL, K, D_H = 32, 2, 16  # TINY's d_model; tiny_overrides' hourglass
W1 = {
    "baseline": [4 * D_MODEL, D_MODEL],
    "hourglass": [K * D_H, D_MODEL],
}  # blocks.0.feed_forward.w1.weight
PAIRS = list(itertools.product(BLOCKS, BLOCKS))  # (checkpoint's model, config's model)
COMMANDS = ("train", "evaluate", "export_hf", "analyze")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_corpus):
    """One tiny run of each block, two steps (its checkpoint: RUN/step2, its config:
    RUN/config.yaml)."""
    root = tmp_path_factory.mktemp("contract")
    for name, (config, extra) in BLOCKS.items():
        block = "hourglass" if name == "hourglass" else "baseline"
        overrides = tiny_overrides(
            root / name, "train.max_steps=2", "train.warmup_steps=1", *extra, block=block
        )
        train(load_and_resolve(DEMO / config, overrides))
    return root


def _tree(root):
    """Every file and folder under root with its size and mtime: what a refusal must leave as it
    was."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _mixed(runs, a: str, b: str):
    """A run folder holding a's checkpoint and b's config.yaml (analyze reads the config beside
    it)."""
    folder = runs / f"mixed-{a}-{b}"
    if not folder.exists():
        shutil.copytree(runs / a / "step2", folder / "step2")
        shutil.copy(runs / b / "config.yaml", folder / "config.yaml")
    return folder


def _command(command: str, runs, a: str, b: str, out):
    """The command line that puts a's checkpoint against b's config, writing to ``out``."""
    checkpoint, config = runs / a / "step2", runs / b / "config.yaml"
    if command == "train":
        return ["train.py", config, f"run.save_folder={out}", "--resume-from", checkpoint]
    if command == "evaluate":
        return [
            "evaluate.py",
            checkpoint,
            "--config",
            config,
            "--out",
            out / "metrics.json",
            "--limit",
            "1",
        ]
    if command == "export_hf":
        return ["export_hf.py", checkpoint, out, "--config", config]
    return ["analyze.py", _mixed(runs, a, b), "--out", out, "--batch", "1", "--seq", "8"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("a,b", [p for p in PAIRS if p[0] != p[1]])
def test_another_models_checkpoint_is_one_line_and_nothing_written(runs, tmp_path, command, a, b):
    args = _command(command, runs, a, b, tmp_path / "out")
    if command == "analyze":
        _mixed(runs, a, b)
    before = _tree(runs)
    r = run_in_process(*args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    line = lines[0]
    # analyze reads the config beside the checkpoint: there, b's
    recorded, block = (runs / f"mixed-{a}-{b}", b) if command == "analyze" else (runs / a, a)
    assert (
        f"written by {recorded / 'config.yaml'} (block {block.replace('-', '_')}, d_model {D_MODEL}"
        in line
    ), line
    # the record's own knobs, not every knob its kind has at its default
    assert ("widths x" in line) == (block == "variable-width") and ", K 1" not in line, line
    assert (
        "first differing weight " in line
        and "there, [" in line
        and "in this config's model" in line
    ), line
    if {a, b} == {"baseline", "hourglass"}:  # the FFN's first projection, from the equations
        assert (
            f"blocks.0.feed_forward.w1.weight: {W1[a]} there, {W1[b]} in this config's model"
            in line
        ), line
    assert not (tmp_path / "out").exists() and _tree(runs) == before


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("block", BLOCKS)
def test_its_own_checkpoint_is_accepted(runs, tmp_path, command, block):
    """The matching pair passes the contract and the command does its work (train: --dry-run's
    plan)."""
    args = _command(command, runs, block, block, tmp_path / "out")
    if command == "train":
        args.append("--dry-run")
    r = run_in_process(*args)
    assert r.returncode == 0 and "differing weight" not in r.stderr, r.stderr[-3000:]
    written = {
        "train": [],
        "evaluate": ["metrics.json"],
        "export_hf": ["config.json"],
        "analyze": ["analysis.json"],
    }
    assert all((tmp_path / "out" / name).is_file() for name in written[command])


def test_the_exit_code_of_a_real_process(runs, tmp_path):
    """Once in a fresh interpreter: the refusal is the process's one line and exit code."""
    mixed = _mixed(runs, "hourglass", "baseline")
    r = run_script("analyze.py", mixed, "--out", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (
        r.stderr[-3000:]
    )
    assert r.stderr.startswith(
        f"analyze: command line: CHECKPOINT={mixed / 'step2'}: written by "
    ), r.stderr
    assert not (tmp_path / "out").exists()


def test_the_save_folders_own_checkpoint_of_another_model_is_refused(runs, tmp_path):
    """A folder with another model's checkpoint and no config.yaml (removed): the automatic resume
    is checked as --resume-from is."""
    folder = tmp_path / "run"
    shutil.copytree(runs / "hourglass" / "step2", folder / "step2")
    before = _tree(folder)
    r = run_in_process("train.py", runs / "baseline" / "config.yaml", f"run.save_folder={folder}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert (
        f"{folder}: its newest checkpoint step2: no readable config.yaml beside it" in lines[0]
    ), lines[0]
    assert (
        f"w1.weight: {W1['hourglass']} there, {W1['baseline']} in this config's model" in lines[0]
    ), lines[0]
    assert _tree(folder) == before


def test_export_into_a_folder_that_is_not_empty(runs, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = _tree(out)
    r = run_in_process("export_hf.py", runs / "baseline" / "step2", out)
    assert (
        r.returncode == 2
        and r.stderr.strip()
        == f"export_hf: OUT_DIR {out}: not empty (1 entries); --force to write into it"
    )
    assert _tree(out) == before
    (out / "tokenizer.json").write_text("{}")  # an earlier export's tokenizer, of another model
    r = run_in_process("export_hf.py", runs / "baseline" / "step2", out, "--force")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "config.json").is_file() and (out / "notes.txt").read_text() == "mine"
    assert not (
        out / "tokenizer.json"
    ).exists()  # replaced whole: no file of the earlier export left


def test_export_into_the_run_folder_is_refused(runs):
    folder = runs / "baseline"
    before = _tree(folder)
    for out in (folder, folder / "step2", folder / "step2" / "hf"):
        r = run_in_process("export_hf.py", folder / "step2", out, "--force")
        assert (
            r.returncode == 2
            and "holds CHECKPOINT" in r.stderr
            and len(r.stderr.strip().splitlines()) == 1
        )
    assert _tree(folder) == before


@pytest.mark.parametrize(
    "device,message",
    [
        (
            "tpu",
            "evaluate.py: error: argument --device: 'tpu' is not a device here (one of cpu, cuda, "
            "cuda:N, mps)",
        ),
        ("cuda:x", "evaluate.py: error: argument --device: 'cuda:x' is not a device here"),
        ("cuda", "evaluate: command line: --device cuda: CUDA is not available on this machine"),
    ],
)
def test_device_names(runs, tmp_path, device, message):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is of a machine without it")
    r = run_in_process(
        "evaluate.py", runs / "baseline" / "step2", "--device", device, "--out", tmp_path / "m.json"
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, (
        r.stderr
    )
    assert not (tmp_path / "m.json").exists()


def test_evaluate_out_never_mixes_two_runs(runs, tmp_path):
    existing = tmp_path / "m.json"
    existing.write_text('{"name": "demo-hourglass", "step": 2}')
    r = run_in_process("evaluate.py", runs / "baseline" / "step2", "--out", existing)
    assert (
        r.returncode == 2 and "holds run demo-hourglass's record, not demo-baseline's" in r.stderr
    ), r.stderr
    assert "--force" in r.stderr and existing.read_text() == '{"name": "demo-hourglass", "step": 2}'
    other = (
        runs / "hourglass"
    )  # demo-hourglass's folder: baseline metrics appended there would pass as its own
    before = _tree(other)
    r = run_in_process("evaluate.py", runs / "baseline" / "step2", "--out", other)
    assert (
        r.returncode == 2
        and "holds run demo-hourglass's metrics" in r.stderr
        and "--force" in r.stderr
    ), r.stderr
    assert _tree(other) == before


def test_analyze_out_holding_other_files(runs, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "table.csv").write_text("x")
    r = run_in_process("analyze.py", runs / "baseline", "--out", out)
    assert r.returncode == 2 and "holds other files (table.csv, ...); --force" in r.stderr, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["table.csv"]


# A script's refusal of what needs no model, in a fresh interpreter: the script run as __main__,
# then whether torch was imported (the test process itself has imported it already).
BEFORE_TORCH = """
import runpy, sys
for argv in {cases!r}:
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        print(e.code, "torch" in sys.modules)
"""


def test_what_needs_no_model_is_refused_before_torch(runs, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    checkpoint, config = str(runs / "baseline" / "step2"), str(runs / "hourglass" / "config.yaml")
    cases = [
        [str(REPO / "scripts" / "evaluate.py"), str(tmp_path / "missing")],
        [str(REPO / "scripts" / "evaluate.py"), checkpoint, "--device", "tpu"],
        [str(REPO / "scripts" / "evaluate.py"), checkpoint, "--out", str(runs / "hourglass")],
        [str(REPO / "scripts" / "export_hf.py"), checkpoint, str(full), "--config", config],
        [str(REPO / "scripts" / "analyze.py"), checkpoint, "--out", str(runs)],
    ]
    r = run([sys.executable, "-c", BEFORE_TORCH.format(cases=cases)])
    assert r.stdout.split("\n")[:-1] == ["2 False"] * len(cases), (r.stdout, r.stderr[-2000:])
    assert len(r.stderr.strip().splitlines()) == len(cases), r.stderr
