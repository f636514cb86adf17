"""Every script's bad arguments: one line on stderr naming the argument and the value, exit 2, no
traceback, nothing written (as tests/test_bad_inputs.py checks for config keys). Each runs in
process (run_in_process: argv, stdout, stderr and the exit code as the interpreter would give
them)."""

import sys
from pathlib import Path

import pytest

from .conftest import REPO, run, run_in_process

BASELINE = str(REPO / "configs" / "demo" / "baseline.yaml")

# (script, arguments with {work}/{file}/{empty}/{folder} filled in, what the line must name)
CASES = [
    (
        "train.py",
        [BASELINE, "run.save_folder={work}/run", "--resume-from", "{work}/missing/step5"],
        "--resume-from",
    ),
    (
        "train.py",
        [BASELINE, "run.save_folder={work}/run", "--resume-from", "{file}"],
        "--resume-from",
    ),
    (
        "train.py",
        [BASELINE, "run.save_folder={work}/run", "--resume-from", "{folder}"],
        "no complete checkpoint",
    ),
    ("train.py", [BASELINE, "run.save_folder=/proc/forbidden/x"], "run.save_folder"),
    ("train.py", ["{empty}"], "empty config file"),
    ("train.py", ["{folder}"], "a folder, not a config file"),
    ("train.py", [BASELINE, "--dry-run", "--nproc-per-node", "0"], "--nproc-per-node"),
    ("train.py", [BASELINE, "--dry-run", "--nodes", "x"], "--nodes"),
    ("train.py", [BASELINE, "--nodes", "2"], "--dry-run"),
    ("train.py", [BASELINE, "--bogus"], "--bogus"),
    ("count_params.py", ["{empty}"], "empty config file"),
    ("count_params.py", ["{folder}"], "a folder"),
    ("count_params.py", [BASELINE, "train.lr=fast"], "'fast' is not a number"),
    ("count_params.py", [BASELINE, "train.compile=maybe"], "'maybe' is not true or false"),
    ("count_params.py", [BASELINE, "model.nope=1"], "model.nope: no such key"),
    ("evaluate.py", ["{file}"], "CHECKPOINT"),
    ("evaluate.py", ["{work}/missing/step5"], "CHECKPOINT"),
    ("evaluate.py", ["{folder}"], "CHECKPOINT"),
    ("evaluate.py", ["{folder}", "--step", "-1"], "--step"),
    ("evaluate.py", ["--hf", "{file}", "--out", "{work}/o.json"], "--hf"),
    ("evaluate.py", ["--hf", "{folder}"], "--out"),
    ("evaluate.py", [], "CHECKPOINT"),
    ("export_hf.py", ["{file}", "{work}/out"], "CHECKPOINT {file}"),
    ("export_hf.py", ["{work}/missing/step5", "{work}/out"], "CHECKPOINT"),
    ("export_hf.py", ["{folder}", "{work}/out"], "not a checkpoint"),
    ("export_hf.py", ["{folder}"], "out_dir"),
    ("search.py", [BASELINE, "--head-dim", "0"], "--head-dim"),
    ("search.py", [BASELINE, "--K", "4", "--layers", "6", "--attention", "-5M"], "--attention"),
    ("analyze.py", ["{work}/missing", "--out", "{work}/o"], "CHECKPOINT"),
    ("analyze.py", ["{folder}", "--out", "{work}/o"], "CHECKPOINT"),
    ("analyze.py", ["{folder}", "--out", "{work}/o", "--names", "a", "b"], "--names"),
    ("make_sweeps.py", ["configs/nowhere"], "FOLDER"),
    ("make_sweeps.py", ["--root", "{folder}"], "--root"),
    ("search.py", [BASELINE, "--head-dim", "63"], "--head-dim"),
    ("search.py", [BASELINE, "--kv-group", "0"], "--kv-group"),
    ("search.py", [BASELINE, "--K", "0"], "--K"),
    ("search.py", [BASELINE, "--top", "-1"], "--top"),
    ("search.py", [BASELINE, "--d-model", "512"], "--d-model"),
    ("search.py", ["0"], "BUDGET=0"),
    (
        "search.py",
        ["113M", "--attention", "45M", "--K", "4", "--layers", "6", "--aligned"],
        "--aligned",
    ),
    (
        "search.py",
        ["113M", "--attention", "45M", "--K", "4", "--layers", "6", "--kv-group", "4"],
        "--kv-group",
    ),
    ("search.py", ["113M", "--K", "4", "--d-h", "600"], "--d-h"),
    ("search.py", ["lots"], "BUDGET=lots"),
    ("search.py", ["{empty}"], "empty config file"),
    ("data_order.py", ["indices", "--world-size", "0", "--out", "{work}/i.npy"], "--world-size"),
    ("data_order.py", ["indices", "--seq-len", "0", "--out", "{work}/i.npy"], "--seq-len"),
    ("data_order.py", ["materialize", "--instances", "0", "--out", "{work}/p"], "--instances"),
    ("data_order.py", ["materialize", "--tokens", "nan", "--out", "{work}/p"], "--tokens"),
    ("data_order.py", ["manifest", "--workers", "0"], "--workers"),
    ("data_order.py", ["verify", "--sample", "-1", "--out", "{work}/p"], "--sample"),
    ("data_order.py", ["shuffle"], "shuffle"),
    ("sweep.py", ["status", "{work}/missing"], "missing"),
    ("sweep.py", ["launch", "--slurm", BASELINE, "--nodes", "0"], "--nodes"),
    ("sweep.py", ["launch", BASELINE], "--local"),
    ("sweep.py", ["report", BASELINE], "--out"),
    ("sweep.py", ["status", BASELINE, "--seeds", "0"], "--seeds"),
    ("sweep.py", ["status", BASELINE, "--seed-list", "1,2,1"], "--seed-list"),
    ("sweep.py", ["launch", "--local", BASELINE, "--lr-grid", "0.5,0,2"], "--lr-grid"),
    ("sweep.py", ["status", BASELINE, "--lr-grid", "1,-2"], "--lr-grid"),
    (
        "sweep.py",
        ["report", BASELINE, "--out", "{work}/r", "--baseline", "nope"],
        "--baseline nope",
    ),
    ("make_tables.py", ["{work}/missing", "--out", "{work}/t"], "missing"),
    (
        "make_tables.py",
        ["{folder}", "--out", "/proc/x/t"],
        "--out /proc/x/t: cannot write in /proc",
    ),
    ("make_tables.py", ["{folder}"], "--out"),
    ("demo.py", ["{empty}"], "empty config file"),
    ("demo.py", [BASELINE, "--set", "train.lr=-1"], "train.lr"),
    ("config_table.py", ["{file}"], "ROOT"),
    ("config_table.py", ["--sizes", "113M"], "unrecognized arguments: --sizes"),
    ("bench.py", ["--scale", "nope"], "--scale"),
    ("bench.py", ["--compile", "maybe"], "--compile"),
    ("bench.py", ["--repeats", "0"], "--repeats"),
    ("bench.py", ["--dtype", "fp8"], "--dtype"),
    ("verify_checkpoints.py", ["{file}"], "RUN_FOLDER"),
    ("verify_checkpoints.py", ["{folder}"], "no complete checkpoint"),
    (
        "tokenize_data.py",
        ["{file}", "--out", "{work}/t", "--tokenizer", "{work}/missing.json"],
        "missing.json",
    ),
    (
        "tokenize_data.py",
        ["{file}", "--out", "{work}/t", "--tokenizer", "{file}"],
        "not a tokenizers JSON",
    ),
    ("tokenize_data.py", ["{file}", "--out", "{file}", "--tokenizer", "{file}"], "--out"),
    (
        "tokenize_data.py",
        ["{file}", "--out", "{work}/t", "--config", "{empty}"],
        "empty config file",
    ),
    (
        "tokenize_data.py",
        ["{file}", "--out", "{work}/t", "--config", BASELINE, "--tokenizer", "{file}"],
        "not allowed",
    ),
    ("coordcheck.py", [BASELINE, "--axes", "K"], "K is not an axis of model.block=baseline"),
    ("coordcheck.py", ["{empty}"], "empty config file"),
    ("gpu_check.py", ["--wheelhouse", "{work}/missing"], "--wheelhouse {work}/missing"),
    ("gpu_check.py", ["--rehearse", "--only", "trainer,nope"], "--only trainer,nope"),
    ("gpu_check.py", ["--rehearse", "--budget-scale", "0"], "--budget-scale 0.0"),
]


@pytest.fixture
def places(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "plain.txt").write_text("x\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "folder").mkdir()
    return {
        "work": str(work),
        "file": str(tmp_path / "plain.txt"),
        "empty": str(tmp_path / "empty.yaml"),
        "folder": str(tmp_path / "folder"),
    }


def test_every_script_is_covered():
    scripts = {p.name for p in (REPO / "scripts").glob("*.py")}
    assert scripts <= {script for script, _, _ in CASES}


@pytest.mark.parametrize(
    "script,args,named",
    CASES,
    ids=[f"{s} {' '.join(a)}".replace(BASELINE, "baseline.yaml") for s, a, _ in CASES],
)
def test_bad_argument_exits_2_with_one_line_and_writes_nothing(places, script, args, named):
    argv = [a.format(**places) for a in args]
    r = run_in_process(script, *argv, cwd=places["work"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert named.format(**places) in lines[0], lines[0]
    assert "full_key" not in lines[0] and "reference_type" not in lines[0]
    assert list(Path(places["work"]).iterdir()) == []


# Every script, generated from scripts/: an option it does not have is argparse's usage error, one
# line (a missing required argument may be named first).
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_option_exits_2_with_one_line(places, script):
    r = run_in_process(script, "--no-such-option", cwd=places["work"])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), (
        r.stderr
    )  # or a missing argument first
    assert list(Path(places["work"]).iterdir()) == []


# A bad input to each script (a missing or unreadable file, a value that cannot work), at least one
# a script; (script, arguments, what the line must name).
INPUTS = [
    ("analyze.py", ["{work}/missing/step5", "--out", "{work}/o"], "CHECKPOINT"),
    ("bench.py", ["--scale", "demo", "--variants", "nope"], "--variants"),
    ("config_table.py", ["{work}/missing"], "ROOT"),
    ("coordcheck.py", ["{work}/missing.yaml"], "missing.yaml"),
    ("count_params.py", ["{work}/missing.yaml"], "missing.yaml"),
    ("count_params.py", [BASELINE, "train.micro_batch_size=3"], "train.micro_batch_size"),
    ("count_params.py", [BASELINE, "train.device=cuda"], "train.device"),
    (
        "data_order.py",
        ["indices", "--paths-file", "{work}/missing.txt", "--out", "{work}/i.npy"],
        "missing.txt",
    ),
    ("data_order.py", ["indices", "--paths-file", "{empty}", "--out", "{work}/i.npy"], "{empty}"),
    ("data_order.py", ["indices", "--paths-file", "{file}", "--out", "{work}/i.npy"], "x"),
    ("demo.py", ["{work}/missing.yaml"], "missing.yaml"),
    ("evaluate.py", ["{work}/missing/step5"], "CHECKPOINT"),
    ("evaluate.py", ["{folder}", "--device", "tpu"], "--device"),
    ("export_hf.py", ["{work}/missing/step5", "{work}/out"], "CHECKPOINT"),
    ("gpu_check.py", ["--budget-scale", "nan"], "--budget-scale"),
    ("make_sweeps.py", ["--root", "{work}/missing"], "--root"),
    ("make_sweeps.py", ["configs/paper2/ablations/r_l-r_d", "--root", "{work}"], "200M/x.yaml"),
    ("make_tables.py", ["{work}/missing", "--out", "{work}/t"], "missing"),
    (
        "make_tables.py",
        ["{folder}", "--out", "/proc/x/t"],
        "--out /proc/x/t: cannot write in /proc",
    ),
    ("search.py", ["{work}/missing.yaml"], "missing.yaml"),
    ("search.py", ["1000"], "BUDGET"),
    ("sweep.py", ["status", "{work}/missing.yaml"], "missing.yaml"),
    (
        "tokenize_data.py",
        ["{work}/missing.txt", "--out", "{work}/t", "--tokenizer", "{file}"],
        "not a tokenizers JSON",
    ),
    ("train.py", [BASELINE, "run.save_folder={file}"], "run.save_folder"),
    ("train.py", [BASELINE, "data.source=numpy", "data.paths=[{work}/none/*.npy]"], "data.paths"),
    ("train.py", [BASELINE, "train.device=cuda"], "train.device"),
    ("train.py", [BASELINE, "train.micro_batch_size=3"], "train.micro_batch_size"),
    ("train.py", [BASELINE, "data.tokenizer_file={file}", "--dry-run"], "data.tokenizer_file"),
    ("verify_checkpoints.py", ["{work}/missing"], "missing"),
]


def _script(case) -> str:
    return case.values[0] if hasattr(case, "values") else case[0]


def test_every_script_has_a_bad_input():
    assert set(SCRIPTS) <= {_script(c) for c in INPUTS}


@pytest.mark.parametrize(
    "script,args,named", INPUTS, ids=[f"{_script(c)}-{i}" for i, c in enumerate(INPUTS)]
)
def test_a_bad_input_exits_2_with_one_line_and_writes_nothing(places, script, args, named):
    r = run_in_process(script, *[a.format(**places) for a in args], cwd=places["work"])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert len(lines) == 1 and named.format(**places) in lines[0], r.stderr
    assert list(Path(places["work"]).iterdir()) == []


# Refusals that need no model come before torch is imported: run in a fresh process whose import of
# torch fails (a refusal after it would exit 1 with ImportError, not 2).
NO_TORCH = """
import json, runpy, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch imported before the refusal")
sys.meta_path.insert(0, NoTorch())
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    sys.exit(e.code)
"""
FAST = [
    ("train.py", [BASELINE, "run.save_folder={file}"]),
    ("train.py", [BASELINE, "data.source=numpy", "data.paths=[{work}/none/*.npy]"]),
    ("train.py", [BASELINE, "train.device=cuda"]),
    ("train.py", [BASELINE, "train.micro_batch_size=3"]),
    ("count_params.py", [BASELINE, "train.lr=fast"]),
    ("count_params.py", [BASELINE, "train.micro_batch_size=3"]),
    ("bench.py", ["--scale", "nope"]),
    ("sweep.py", ["status", "{work}/missing.yaml"]),
    ("config_table.py", ["{file}"]),
    ("coordcheck.py", ["{empty}"]),
]


@pytest.mark.parametrize(
    "script,args",
    FAST,
    ids=[f"{s} {' '.join(a)}".replace(BASELINE, "baseline.yaml") for s, a in FAST],
)
def test_a_refusal_that_needs_no_model_imports_no_torch(places, script, args):
    r = run(
        [
            sys.executable,
            "-c",
            NO_TORCH,
            str(REPO / "scripts" / script),
            *[a.format(**places) for a in args],
        ]
    )
    assert r.returncode == 2 and "torch imported" not in r.stderr, r.stderr[-2000:]
