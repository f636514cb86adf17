"""Every key of the spec and every numeric argument of every script, fed wrong types, out-of-domain
and extreme values: generated from the spec's dataclasses and the scripts' argparse parsers, not
listed. A bad value exits 2 (load: a ConfigError) with one line naming the source (the file or
"command line") and the key; a value that may be legal (0, a negative where the default is
negative) is accepted or refused that way, never a traceback or another key's blame. Nothing is
written under the working folder. Most cases load in this process (milliseconds each); a few go
through a fresh interpreter as a user's would."""

import argparse
import ast
import dataclasses
import math
import runpy
import sys
import time
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from olmo_patches.blocks import BLOCKS
from olmo_patches.config import ConfigError, ExperimentSpec
from olmo_patches.launch.data_files import check_data_files
from olmo_patches.launch.layout import Layout, load_and_resolve
from olmo_patches.config import spec as spec_module

from .conftest import REPO, run_in_process, run_script

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
# one load, refusal included: the bound on the CPU seconds of a case (milliseconds on an idle core;
# CPU time, not wall time: what the check costs, whatever else shares the machine)
SECONDS = 5.0


# where the keys are written: config/spec.py, and each kind's model keys in olmo_patches/blocks/
MODULES = {spec_module.__file__} | {
    sys.modules[c.__module__].__file__
    for kind in BLOCKS.values()
    for c in kind.spec.__mro__
    if dataclasses.is_dataclass(c)
}


def _comments() -> dict:
    """Each dataclass field's comment in config/spec.py and the blocks' modules, by (class,
    field): the comment on one of its lines, else the comment lines right above it."""
    found = {}
    for module in MODULES:
        found.update(_module_comments(Path(module).read_text().splitlines()))
    return found


def _module_comments(source: list) -> dict:
    found = {}
    for node in ast.walk(ast.parse("\n".join(source))):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    lines = source[item.lineno - 1 : item.end_lineno]
                    trailing = [x.split("  # ", 1)[1] for x in lines if "  # " in x]
                    above, i = [], item.lineno - 2
                    while source[i].strip().startswith("# "):
                        above.insert(0, source[i].strip()[2:])
                        i -= 1
                    found[(node.name, item.target.id)] = (trailing or [" ".join(above)])[0]
    return found


COMMENTS = _comments()


def _walk(cls, prefix=""):
    """(key, type, default, comment) of every leaf of the spec, nested sections included; model:
    the keys of every registered kind (each kind's schema, config/load.py)."""
    hints = typing.get_type_hints(cls)  # each field's in the module of the class declaring it
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        optional = typing.get_origin(kind) is typing.Union
        inner = next(a for a in typing.get_args(kind) if a is not type(None)) if optional else kind
        if dataclasses.is_dataclass(inner):
            key = f"{prefix}{f.name}"
            for schema in [k.spec for k in BLOCKS.values()] if key == "model" else [inner]:
                yield from _walk(schema, f"{key}.")
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        owner = next(c for c in cls.__mro__ if f.name in vars(c).get("__annotations__", {}))
        yield f"{prefix}{f.name}", inner, default, COMMENTS.get((owner.__name__, f.name), "")


KEYS = list({key[0]: key for key in _walk(ExperimentSpec)}.values())  # a shared key once

# The settings under which a key is read (its section present, its block or source in use).
HOURGLASS = ["model.block=hourglass", "model.K=2", "model.d_h=64"]
VARIABLE = ["model.block=variable_width"]
MOE = [*VARIABLE, "model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_hidden=128"]
CONTEXT = {
    "model.K": HOURGLASS,
    "model.d_h": HOURGLASS,
    "model.d_h_ratio": [*HOURGLASS, "model.d_h=null", "model.d_h_ratio=0.5"],
    "model.d_h_multiple": [*HOURGLASS, "model.d_h=null", "model.d_h_ratio=0.5"],
    "model.ffn": VARIABLE,
    "model.widths.": VARIABLE,
    "model.moe.": MOE,
    "model.rope_scaling.": ["model.rope_scaling.factor=8"],
    "train.power.": ["train.schedule=power", "train.power.a=64", "train.power.c=2048"],
    "train.activation_checkpointing.block_interval": [
        "train.activation_checkpointing=selected_blocks:2"
    ],
    "train.activation_checkpointing.budget": [
        "train.activation_checkpointing=budget:0.5",
        "train.compile=true",
    ],
    "train.activation_checkpointing.modules": [
        "train.activation_checkpointing=selected_modules:blocks.*.attention"
    ],
    "data.paths": ["data.source=numpy", "data.tokenizer=dolma2", "model.vocab_size=null"],
    "data.base": ["data.source=olmo2_stage1", "data.tokenizer=dolma2", "model.vocab_size=null"],
}


def context(key: str) -> list:
    return next(
        (v for k, v in CONTEXT.items() if key == k or (k.endswith(".") and key.startswith(k))), []
    )


def choices(comment: str) -> bool:
    """A string key whose comment lists its values (``a | b | c``): any other word is refused."""
    return " | " in comment or " | " in comment.split(":")[0]


def must_refuse(kind, default, comment: str) -> list:
    """Values that are wrong whatever the key means: by the key's type, the sign of its default, the
    choices its comment lists."""
    shapes = ["{a: 1}"] + (
        ["[1]"] if kind is not typing.List[int] and typing.get_origin(kind) is not list else []
    )
    if (
        kind is bool
    ):  # omegaconf's BooleanNode reads any integer as a bool (0: false), as Python does
        return ["abc", "1.5", *shapes]
    if kind in (int, float):
        values = ["abc", "''", "nan", "-inf", "1e23", "99999999999999999999999", *shapes]
        if not (isinstance(default, (int, float)) and default < 0):
            values += ["-1"]
        return values + (["1.5"] if kind is int else [])
    if kind is str:
        return ["''", "' '", *shapes] + (["not-a-choice"] if choices(comment) else [])
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0]
        return ["{a: 1}"] + (["[nan]", "[1e23]", "[abc]"] if item in (int, float) else ["['']"])
    return shapes


def may_accept(kind) -> list:
    return ["0"] if kind in (int, float) else ["abc"]


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working folder (relative defaults land here) that must stay empty."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    yield folder
    assert list(folder.iterdir()) == []


def _load(overrides: list, path: Path = BASELINE, work: Path = Path("."), key: str = ""):
    base = [
        f"{k}={work / v}"
        for k, v in (("run.save_folder", "run"), ("data.work_dir", "cache"))
        if k != key
    ]
    start = time.process_time()
    try:  # what scripts/train.py checks before torch: the config, the machine, the data files
        check_data_files(load_and_resolve(path, [*base, *overrides], Layout.plan(1, 1)))
        return None, time.process_time() - start
    except ConfigError as e:
        return str(e), time.process_time() - start


def _check(line, seconds, key: str, source: str, refuse: bool, what: str) -> None:
    assert seconds < SECONDS, f"{what}: {seconds:.1f} s"
    if line is None:
        assert not refuse, f"{what}: accepted"
        return
    assert "\n" not in line, f"{what}: {line}"
    assert line.startswith(f"{source}: "), f"{what}: blamed {line}"
    assert key in line, f"{what}: does not name {key}: {line}"


def test_the_walk_covers_every_section():
    sections = {key.rsplit(".", 1)[0] for key, *_ in KEYS}
    assert {
        "run",
        "model",
        "model.widths",
        "model.moe",
        "model.rope_scaling",
        "data",
        "train",
        "train.power",
        "train.activation_checkpointing",
        "eval",
    } <= sections
    assert len(KEYS) >= 100


def test_every_context_loads(work, demo_paths):
    """The settings each key is tried in are themselves good (else every refusal would be
    theirs)."""
    for extra in {tuple(v) for v in CONTEXT.values()}:
        line, _ = _load([*_paths(list(extra), demo_paths)], work=work)
        assert line is None, line


@pytest.fixture
def demo_paths(tmp_path):
    """A token file that data.source=numpy reads: 4096 uint32 tokens (dolma2's dtype)."""
    path = tmp_path / "tokens.npy"
    path.write_bytes(bytes(4 * 4096))
    return str(path)


def _paths(extra: list, path: str) -> list:
    return [*extra, f"data.paths=[{path}]"] if "data.source=numpy" in extra else extra


def first_of_each_kind(values: list) -> list:
    """A word, a non-finite or huge number, a negative, a wrong shape: one of each (the rest are
    drawn below)."""
    kinds = [
        lambda v: v[:1].isalpha() or v.startswith("'") or v == "not-a-choice",
        lambda v: v in ("nan", "-inf", "1e23", "99999999999999999999999"),
        lambda v: v == "-1",
        lambda v: v[:1] in "[{",
    ]
    return [next(v for v in values if kind(v)) for kind in kinds if any(kind(v) for v in values)]


@pytest.mark.parametrize("key,kind,default,comment", KEYS, ids=[k for k, *_ in KEYS])
def test_every_key_refuses_bad_values_on_the_command_line(
    work, demo_paths, key, kind, default, comment
):
    base = _paths(context(key), demo_paths)
    for value in first_of_each_kind(must_refuse(kind, default, comment)):
        _check(
            *_load([*base, f"{key}={value}"], work=work, key=key),
            key,
            "command line",
            True,
            f"{key}={value}",
        )
    for value in may_accept(kind):
        _check(
            *_load([*base, f"{key}={value}"], work=work, key=key),
            key,
            "command line",
            False,
            f"{key}={value}",
        )


CASES = [
    (key, value)
    for key, kind, default, comment in KEYS
    for value in must_refuse(kind, default, comment)
]


@pytest.mark.slow
@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(CASES))
def test_any_bad_value_of_any_key_is_refused(tmp_path_factory, case):
    key, value = case
    work = tmp_path_factory.mktemp("w")
    path = work / "tokens.npy"
    path.write_bytes(bytes(4 * 4096))
    _check(
        *_load([*_paths(context(key), str(path)), f"{key}={value}"], work=work / "w", key=key),
        key,
        "command line",
        True,
        f"{key}={value}",
    )


def _yaml(key: str, value: str) -> str:
    parts = key.split(".")
    return (
        "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parts[:-1]))
        + f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}\n"
    )


@pytest.mark.parametrize("key,kind,default,comment", KEYS, ids=[k for k, *_ in KEYS])
def test_every_key_refuses_a_bad_value_in_a_file(
    tmp_path, work, demo_paths, key, kind, default, comment
):
    """The first must-refuse value, written in a config that extends the demo's: the line blames
    that file."""
    value = must_refuse(kind, default, comment)[0]
    config = tmp_path / "bad.yaml"
    config.write_text(f"extends: {BASELINE}\n{_yaml(key, value)}")
    _check(
        *_load(_paths(context(key), demo_paths), config, work, key),
        key,
        str(config),
        True,
        f"{key}: {value} in a file",
    )


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).filter(
        lambda x: not math.isfinite(x) or abs(x) > 2**53
    ),
    st.integers(min_value=2**53 + 1),
    st.integers(max_value=-(2**53) - 1),
)
WORDS = st.text(st.characters(whitelist_categories=("Ll", "Lu")), min_size=1, max_size=12).filter(
    lambda w: w.lower()
    not in ("true", "false", "yes", "no", "on", "off", "null", "nan", "inf", "y", "n")
)
NUMERIC = [k for k in KEYS if k[1] in (int, float)]
CHOICES = [k for k in KEYS if k[1] is str and choices(k[3])]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(NUMERIC), NUMBERS)
def test_any_number_beyond_2_53_or_not_finite_is_refused(tmp_path_factory, key_kind, number):
    key, kind, default, comment = key_kind
    text = repr(number) if isinstance(number, float) else str(number)
    line, seconds = _load([*context(key), f"{key}={text}"], work=tmp_path_factory.mktemp("w"))
    _check(line, seconds, key, "command line", True, f"{key}={text}")


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(NUMERIC + CHOICES), WORDS)
def test_any_word_is_refused_by_a_number_or_a_choice(tmp_path_factory, key_kind, word):
    key, kind, default, comment = key_kind
    line, seconds = _load([*context(key), f"{key}={word}"], work=tmp_path_factory.mktemp("w"))
    legal = (
        kind is str
        and word in comment.replace("|", " ").replace("(", " ").replace(":", " ").split()
    )
    _check(line, seconds, key, "command line", not legal, f"{key}={word}")


# --- the scripts' arguments -----------------------------------------------------------------------

# Every script that takes arguments (gpu_check.py runs before the project's dependencies exist:
# plain argparse)
SCRIPTS = sorted(
    p.name
    for p in (REPO / "scripts").glob("*.py")
    if p.name != "gpu_check.py" and "add_argument(" in p.read_text()
)


class _Parsed(BaseException):
    pass


def _parsers(script: str) -> list:
    """(argv prefix, parser) of the script's parser and each subcommand's, captured as main()
    parses."""
    found = []

    def capture(self, *args, **kwargs):
        found.append(self)
        raise _Parsed

    saved = {
        name: getattr(argparse.ArgumentParser, name)
        for name in ("parse_args", "parse_intermixed_args", "parse_known_args")
    }
    old_argv = sys.argv
    try:
        for name in saved:
            setattr(argparse.ArgumentParser, name, capture)
        sys.argv = [script]
        with pytest.raises(_Parsed):
            runpy.run_path(str(REPO / "scripts" / script), run_name="__main__")
    finally:
        for name, method in saved.items():
            setattr(argparse.ArgumentParser, name, method)
        sys.argv = old_argv
    parsers = [([], found[0])]
    for action in found[0]._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += [([name], sub) for name, sub in action.choices.items()]
    return parsers


def _numeric(action) -> bool:
    if action.type in (int, float):
        return True
    try:  # at_least(...) and the like: a number parses
        return action.type is not None and isinstance(action.type("1"), (int, float))
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return isinstance(action.type, type(lambda: 0)) and action.type.__name__ in (
            "parse",
            "fraction",
        )


ARGUMENTS = [
    (script, prefix, action.option_strings[-1])
    for script in SCRIPTS
    for prefix, parser in _parsers(script)
    for action in parser._actions
    if action.option_strings and _numeric(action)
]
BAD_NUMBERS = ["abc", "nan", "inf", "1e23", "99999999999999999999999", "-5e6"]


def test_the_walk_finds_the_scripts_numeric_arguments():
    names = {(s, o) for s, _, o in ARGUMENTS}
    assert {
        ("train.py", "--nodes"),
        ("search.py", "--attn-fraction"),
        ("evaluate.py", "--limit"),
        ("sweep.py", "--nodes"),
        ("data_order.py", "--seed"),
        ("bench.py", "--seq"),
    } <= names
    assert len(ARGUMENTS) >= 30


@pytest.mark.parametrize(
    "script,prefix,option", ARGUMENTS, ids=[f"{s} {' '.join(p)} {o}" for s, p, o in ARGUMENTS]
)
def test_every_numeric_argument_refuses_bad_values(work, script, prefix, option):
    for value in BAD_NUMBERS:
        start = time.process_time()
        result = run_in_process(script, *prefix, f"{option}={value}", cwd=work, timeout=60)
        assert time.process_time() - start < SECONDS, f"{script} {option}={value}"
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and result.stdout == "", (
            f"{script} {option}={value}: {result.returncode} {result.stderr}"
        )
        assert len(lines) == 1 and option in lines[0] and "error: argument" in lines[0], (
            f"{script} {option}={value}: {result.stderr}"
        )


def test_a_negative_budget_is_a_value_not_an_unknown_option(work):
    result = run_in_process("search.py", "-5e6", cwd=work)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "required" not in result.stderr and "-5e6" in result.stderr, result.stderr


# --- what a new user tried: in process, and two through a fresh interpreter -----------------------

NEWCOMER = [
    ("train.py", [str(BASELINE), "train.global_batch_size=1e23"], "train.global_batch_size"),
    (
        "train.py",
        [str(BASELINE), "train.global_batch_size=100000000000"],
        "train.global_batch_size",
    ),
    ("train.py", [str(BASELINE), "data.sequence_length=1000000000"], "data.sequence_length"),
    ("train.py", [str(BASELINE), "train.seed=-1"], "train.seed"),
    ("train.py", [str(BASELINE), "model.d_h_multiple=0"], "model.d_h_multiple"),
    (
        "train.py",
        [str(BASELINE), "model.block=variable_width", "model.widths.r_d=0"],
        "model.widths.r_d",
    ),
    (
        "train.py",
        [str(BASELINE), "model.block=variable_width", "model.widths.r_l=1.5"],
        "model.widths.r_l",
    ),
    (
        "train.py",
        [
            str(BASELINE),
            "train.schedule=power",
            "train.power.a=64",
            "train.power.c=2048",
            "train.power.b=nan",
        ],
        "train.power.b",
    ),
    ("train.py", [str(BASELINE), "run.stop_at_step=201"], "run.stop_at_step"),
    ("train.py", [str(BASELINE), "train=5"], "train"),
    ("sweep.py", ["launch", "--local", str(BASELINE), "--set", "model.K=0"], "model.K"),
    ("search.py", [str(BASELINE), "--attn-fraction", "1.5"], "--attn-fraction"),
    ("search.py", [str(BASELINE), "--attn-fraction", "0"], "--attn-fraction"),
    ("search.py", ["-5e6"], "-5e6"),
]


@pytest.mark.parametrize(
    "script,args,key", NEWCOMER, ids=[f"{s} {' '.join(a[1:])}" for s, a, _ in NEWCOMER]
)
def test_what_a_new_user_tried_is_refused_in_one_line(work, script, args, key):
    extra = (
        [f"run.save_folder={work / 'run'}", f"data.work_dir={work / 'cache'}"]
        if script == "train.py"
        else []
    )
    result = run_in_process(script, *args, *extra, cwd=work, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and result.stdout == "" and len(lines) == 1 and key in lines[0], (
        result.stderr
    )


def test_a_yaml_section_set_to_a_value_names_the_file_and_the_key(tmp_path, work):
    config = tmp_path / "bad.yaml"
    config.write_text(f"extends: {BASELINE}\ntrain: 5\n")
    line, _ = _load([], config, work)
    assert line == f"{config}: train: '5' is not a section (a mapping of keys)"


@pytest.mark.parametrize(
    "script,args,key", [NEWCOMER[0], NEWCOMER[-3]], ids=["train.py", "search.py"]
)
def test_a_fresh_process_refuses_in_one_line(tmp_path, script, args, key):
    result = run_script(
        script, *args, *([f"run.save_folder={tmp_path / 'run'}"] if script == "train.py" else [])
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and key in lines[0], result.stderr
    assert not (tmp_path / "run").exists()


# --- files and folders ----------------------------------------------------------------------------

NUMPY = [
    "data.source=numpy",
    "data.tokenizer=dolma2",
    "model.vocab_size=null",
]  # dolma2's 100,278 ids: uint32 files (OLMo-core's get_dtype)


def _token_files(root: Path) -> dict:
    """Bad token files, each as a user might give one: OLMo-core would read 0 instances from
    most."""
    import numpy as np

    root.mkdir()
    files = {"missing": root / "missing.npy", "folder": root}
    for name, data in {
        "empty": b"",
        "1001 bytes": bytes(1001),  # not whole uint32 tokens
        "one token short of a sequence": bytes(4 * 127),  # data.sequence_length=128
        "uint16": np.full(4096, 5000, dtype=np.uint16).tobytes(),  # read as uint32: ids 327,685,000
    }.items():
        files[name] = root / f"{name}.npy"
        files[name].write_bytes(data)
    return files


@pytest.mark.parametrize(
    "case", ["missing", "folder", "empty", "1001 bytes", "one token short of a sequence", "uint16"]
)
def test_a_bad_token_file_is_one_line_naming_it(tmp_path, work, case):
    path = _token_files(tmp_path / "data")[case]
    line, seconds = _load([*NUMPY, f"data.paths=[{path}]"], work=work)
    _check(line, seconds, "data.paths", "command line", True, case)
    assert str(path) in line


def test_token_files_short_of_one_global_batch_are_refused(tmp_path, work):
    path = tmp_path / "tokens.npy"
    path.write_bytes(bytes(4 * 128 * 15))  # 15 instances; the demo's global batch is 16
    line, _ = _load([*NUMPY, f"data.paths=[{path}]"], work=work)
    assert (
        line is not None and "data.paths" in line and "fewer than one global batch of 16" in line
    ), line
    path.write_bytes(bytes(4 * 128 * 16))
    assert _load([*NUMPY, f"data.paths=[{path}]"], work=work)[0] is None


@pytest.mark.parametrize("key", ["run.save_folder", "data.work_dir", "data.demo_cache"])
def test_a_folder_that_is_a_file_or_under_one_is_refused(tmp_path, work, key):
    file = tmp_path / "file"
    file.write_text("x")
    for folder in (file, file / "sub"):
        line, seconds = _load([f"{key}={folder}"], work=work, key=key)
        _check(line, seconds, key, "command line", True, f"{key}={folder}")


def _paths_of(tmp_path: Path) -> dict:
    file = tmp_path / "file.txt"
    file.write_text("x\n")
    return {
        "file": file,
        "under a file": file / "sub",
        "missing": tmp_path / "missing",
        "folder": tmp_path,
    }


# (script, arguments with {file}, {under a file}, {missing}, {folder}, the argument the line names)
PATHS = [
    ("evaluate.py", ["{folder}", "--out", "{under a file}/m.json"], "--out"),
    ("evaluate.py", ["{folder}", "--out", "{file}"], "--out"),
    ("sweep.py", ["report", str(BASELINE), "--out", "{file}"], "--out"),
    ("make_tables.py", ["{folder}", "--out", "{file}"], "--out"),
    ("search.py", [str(BASELINE), "--write", "{file}"], "--write"),
    ("demo.py", ["--out", "{under a file}"], "--out"),
    ("export_hf.py", ["{folder}", "{file}"], "OUT_DIR"),
    ("data_order.py", ["manifest", "--paths-file", "{missing}"], "--paths-file"),
    (
        "data_order.py",
        ["indices", "--paths-file", "{folder}", "--out", "{missing}"],
        "--paths-file",
    ),
    ("data_order.py", ["materialize", "--instances", "1", "--out", "{file}"], "--out"),
    ("data_order.py", ["indices", "--out", "{folder}"], "--out"),
    ("data_order.py", ["verify", "--out", "{missing}"], "--out"),
    ("data_order.py", ["verify", "--out", "{file}", "--base", "{missing}"], "--base"),
    ("train.py", [str(BASELINE), "run.save_folder={file}"], "run.save_folder"),
]


@pytest.mark.parametrize("script,args,name", PATHS, ids=[f"{s} {' '.join(a)}" for s, a, _ in PATHS])
def test_a_path_of_the_wrong_kind_is_one_line_before_any_work(tmp_path, work, script, args, name):
    paths = _paths_of(tmp_path)
    argv = [a.format(**paths) for a in args]
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    result = run_in_process(script, *argv, cwd=work, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and name in lines[0], result.stderr
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_the_demo_corpus_cache_does_not_depend_on_the_working_folder(tmp_path, work):
    """data.demo_cache=null: the same cache from any folder, the checkout's (found from the
    package)."""
    from olmo_patches.config.spec import demo_cache

    here = load_and_resolve(BASELINE, [f"run.save_folder={work / 'run'}"], Layout.plan(1, 1))
    assert demo_cache(here) == REPO / ".cache" / "demo-corpus"
    elsewhere = load_and_resolve(
        BASELINE,
        [f"run.save_folder={work / 'run'}", f"data.demo_cache={tmp_path / 'c'}"],
        Layout.plan(1, 1),
    )
    assert demo_cache(elsewhere) == tmp_path / "c"


def test_a_dry_run_into_another_runs_folder_is_refused_like_the_run(tmp_path, work):
    import json
    import os
    import socket

    from olmo_patches.config import spec_to_yaml

    run = tmp_path / "run"
    run.mkdir()
    other = load_and_resolve(
        BASELINE, [f"run.save_folder={run}", "train.lr=1e-3"], Layout.plan(1, 1)
    )
    (run / "config.yaml").write_text(spec_to_yaml(other))
    # a complete checkpoint beside the record, as OLMo-core's Checkpointer.dir_is_checkpoint knows
    # one (a record without one binds nothing: tests/test_run_record.py)
    for name in ("train/rank0.pt", "model_and_optim/.metadata", ".metadata.json"):
        (run / "step2" / name).parent.mkdir(parents=True, exist_ok=True)
        (run / "step2" / name).write_text("")
    before = sorted(p.name for p in run.iterdir())
    result = run_in_process(
        "train.py", str(BASELINE), f"run.save_folder={run}", "--dry-run", cwd=work
    )
    lines = result.stderr.strip().splitlines()
    assert (
        result.returncode == 2
        and result.stdout == ""
        and "holds a run with another config (changed: train.lr" in lines[-1]
    ), result.stderr
    (run / "config.yaml").unlink()
    holder = {
        "host": socket.gethostname(),
        "pid": os.getppid(),
        "slurm_job": None,
        "since": "then",
    }  # a live process
    (run / ".lock").write_text(json.dumps(holder))
    result = run_in_process(
        "train.py", str(BASELINE), f"run.save_folder={run}", "--dry-run", cwd=work
    )
    assert (
        result.returncode == 2
        and f"is in use by pid {os.getppid()}" in result.stderr.strip().splitlines()[-1]
    ), result.stderr
    assert before == ["config.yaml", "step2"] and sorted(p.name for p in run.iterdir()) == [
        ".lock",
        "step2",
    ]  # nothing written


@pytest.mark.slow
def test_a_busy_run_folder_is_one_line_in_a_fresh_process(tmp_path):
    """Refused after the process group started: the line alone, no C++ warning from its teardown."""
    import json
    import os
    import socket

    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(
        json.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": None, "since": "then"}
        )
    )
    result = run_script(
        "train.py", str(BASELINE), f"run.save_folder={run}", f"data.work_dir={tmp_path / 'cache'}"
    )
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: {run} is in use by pid {os.getpid()} on {socket.gethostname()} since then; "
        f"wait for it, or remove {run / '.lock'} if that process is gone"
    ], result.stderr


# --- a quiet terminal -----------------------------------------------------------------------------


@pytest.mark.slow
def test_json_output_is_the_json_alone(tmp_path):
    """count_params --json with float8 (torchao imported: its kernel probes, torch's Enum
    deprecation) and with an MoE (OLMo-core's grouped_gemm note at build), one after the other in
    one fresh interpreter (as a user's, without pytest's warning capture): stdout two JSON objects,
    stderr empty."""
    import json

    from .conftest import run

    runs = [[str(BASELINE), "train.float8=tensorwise", "--json"], [str(BASELINE), *MOE, "--json"]]
    script = str(REPO / "scripts" / "count_params.py")
    code = "import runpy, sys\n" + "".join(
        f"sys.argv = {['count_params.py', *argv]!r}\n"
        f"runpy.run_path({script!r}, run_name='__main__')\n"
        for argv in runs
    )
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert [type(json.loads(line)) for line in result.stdout.splitlines()] == [dict, dict]
