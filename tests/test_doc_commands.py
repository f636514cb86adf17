"""Every shell command in README.md and docs/*.md (fenced ``bash``/plain blocks and indented blocks)
is run as written, or, where it needs a GPU, a cluster, the network or hours, parsed: a command
whose text drifts from the code fails here.

Each command must match one row of COMMANDS (first match wins). The row says how it is checked:

- ``run``: as written, plus the row's ``shrink`` arguments appended (e.g. ``train.max_steps=1``:
  later overrides win), in a scratch folder with the repo's configs/, scripts/ and caches linked in.
- ``parse``: needs the network, a finished run or hours; ``--help`` of the script (and of its
  subcommand) must list every ``--flag`` the doc writes.
- ``gpu``: a GPU launch. torchrun's own parser reads the torchrun flags, then scripts/train.py
  plans the launch (``--dry-run --nproc-per-node N --nodes M``) for the doc's config and overrides;
  sbatch lines run scripts/launch_slurm.sbatch against a fake SLURM and then its pre-flight dry run.

A new documented command without a row fails with a message naming the doc and the line: add a row.
A line may start with environment assignments (``HOURGLASS_BLOCKS=tests._parallel_block python
...``): the row matches the command after them, which runs in a fresh interpreter with them set
(the registry reads HOURGLASS_BLOCKS at import).
"""

from __future__ import annotations

import re
import shlex
import sys
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO, run, run_in_process

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
COMMAND_START = ("python", "torchrun", "sbatch", "make", "pytest")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")  # a shell line's leading VAR=value

# Shrinks: a few steps of the demo's own model, short sequences, two validation batches.
TINY_TRAIN = ("train.max_steps=1", "data.sequence_length=32", "eval.max_batches=1")
TINY_SEARCH = (
    "--top",
    "3",
    "--K",
    "4",
    "--d-h-ratio",
    "0.5",
)  # one K and one d_h/d_model: the doc's other flags as written
TINY_BENCH = ("--repeats", "1", "--warmup", "0", "--compile", "off", "--seq", "16", "--batch", "1")


@dataclass(frozen=True)
class Row:
    match: str  # regex, re.match against the command (comments stripped, continuations joined)
    how: str  # run | parse | gpu
    shrink: tuple[str, ...] = ()  # run: arguments appended to the command
    why: str = ""  # parse: why it is not run


COMMANDS = [
    Row(
        r"python scripts/tokenize_data\.py ",
        "parse",
        why="your text files (tests/test_tokenize.py tokenizes small ones)",
    ),
    Row(
        r"python benchmarks/bench_tokenize\.py", "parse", why="minutes of tokenizing on 2 CPU cores"
    ),
    Row(
        r"python scripts/train\.py (my_run\.yaml|\S+ .*--init-from)",
        "parse",
        why="your tokens and weights (tests/test_mixture.py, "
        "tests/test_init_from.py run small ones)",
    ),
    Row(
        r"make (demo|test)$",
        "parse",
        why="the demo (minutes) and the suite itself: `make -n` and the script's flags",
    ),
    Row(r"python scripts/train\.py configs/demo/\S+\.yaml", "run", TINY_TRAIN),
    Row(r"python scripts/train\.py \S+ .*--dry-run", "run"),
    Row(r"python scripts/count_params\.py ", "run"),
    # one K and one d_h/d_model given: quick as written (the shrink's K=4 would ask for another
    # shape)
    Row(
        r"python scripts/search\.py \S+ --K \d+ --layers \d+ --d-h-ratio [\d.]+ --aligned$",
        "run",
        ("--top", "3"),
    ),
    # fixed dimensions or the paper's split: no d_h/d_model to shrink the grid with (refused)
    Row(r"python scripts/search\.py .*--(d-model|attention) ", "run", ("--top", "3")),
    Row(r"python scripts/search\.py ", "run", TINY_SEARCH),
    Row(
        r"python scripts/analyze\.py runs/",
        "parse",
        why="the demo runs' checkpoints (tests/test_analysis.py runs it on tiny ones)",
    ),
    Row(
        r"python scripts/make_sweeps\.py",
        "parse",
        why="rewrites configs/113M/ablations (minutes); "
        "tests/test_paper_configs.py runs one folder",
    ),
    Row(r"python scripts/config_table\.py", "run"),
    Row(
        r"python scripts/make_tables\.py runs-reference/",
        "parse",
        why="the reference model's evaluated folder (docs/paper_runs.md)",
    ),
    Row(r"python scripts/make_tables\.py ", "run", ("--no-figures",)),
    Row(r"python scripts/bench\.py( --json)?$", "run", TINY_BENCH),
    Row(r"python scripts/bench\.py --scale 113M --repeats", "parse", why="113M on CPU: minutes"),
    Row(r"python scripts/bench\.py --scale 113M,1B", "gpu"),
    Row(
        r"python scripts/bench\.py --generate$",
        "parse",
        why="compiles six decoding graphs: minutes of CPU (tests/test_export_hf.py runs it tiny)",
    ),
    Row(r"python scripts/bench\.py --generate --scale 113M,1B", "gpu"),
    Row(
        r"python scripts/data_order\.py (materialize|manifest|verify|indices)",
        "parse",
        why="olmo-data.org, or its materialized prefix",
    ),
    Row(
        r"python scripts/export_hf\.py runs/",
        "parse",
        why="needs a finished run's checkpoint (tests/test_export_hf.py exports one)",
    ),
    Row(
        r"python scripts/verify_checkpoints\.py runs/",
        "parse",
        why="needs a finished run (tests/test_resume.py verifies a damaged one)",
    ),
    Row(r"torchrun ", "gpu"),
    Row(r"sbatch ", "gpu"),
    Row(r"(python -m )?pytest ", "parse", why="this suite, or a part of it"),
    Row(
        r"make wheelhouse",
        "parse",
        why="downloads 54 MiB of wheels (tests/test_gpu_install.py builds it, marked install)",
    ),
    Row(
        r"python scripts/gpu_check\.py",
        "parse",
        why="a CUDA GPU, or minutes of CPU (--rehearse: tests/test_gpu_install.py, slow)",
    ),
    Row(r"python benchmarks/bench_loader\.py", "parse", why="minutes of worker start-up"),
    Row(r"python benchmarks/bench_allgather_copy\.py", "run", ("--repeats", "1")),
    Row(r"python scripts/sweep\.py (status|report) configs/demo/ablations/", "run"),
    Row(
        r"python scripts/coordcheck\.py configs/demo/\S+\.yaml( model\.widths\.init=mup)?$",
        "parse",
        why="about a minute each at the demo's width x8 (tests/test_coordcheck.py: tiny widths)",
    ),
    Row(r"python scripts/coordcheck\.py ", "run", ("--steps", "2", "--seeds", "1")),
    Row(
        r"python scripts/sweep\.py ",
        "parse",
        why="trains a table's worth of runs, or needs SLURM (tests/test_sweep.py)",
    ),
    Row(
        r"python scripts/evaluate\.py ",
        "parse",
        why="needs a finished run or an HF folder (tests/test_evaluate.py)",
    ),
    Row(
        r"python scripts/train\.py \S+ .*data\.base=",
        "parse",
        why="a mirror of OLMo-2's files (tests/test_data_order.py)",
    ),
]


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"

    @property
    def env(self) -> dict[str, str]:
        """The line's leading VAR=value assignments."""
        words = shlex.split(self.text)
        return dict(w.split("=", 1) for w in words[: _assignments(words)])

    @property
    def command(self) -> str:
        """The line after its assignments."""
        words = shlex.split(self.text)
        return " ".join(shlex.quote(w) for w in words[_assignments(words) :])


def _assignments(words: list[str]) -> int:
    """How many of a line's first words are VAR=value assignments."""
    return next((i for i, w in enumerate(words) if not ASSIGNMENT.match(w)), len(words))


def doc_commands(docs: list[Path] = DOCS) -> list[DocCommand]:
    """The shell commands of fenced (shell or plain) and indented code blocks, in doc order."""
    found = []
    for path in docs:
        lines, fence, prev_blank = path.read_text().splitlines(), None, True
        i = 0
        while i < len(lines):
            raw = lines[i]
            if raw.lstrip().startswith("```"):
                fence = None if fence is not None else raw.strip()[3:].strip()
                i += 1
                continue
            code = (
                fence in SHELL_FENCES
                if fence is not None
                else (raw.startswith("    ") and (prev_blank or _indented(lines, i)))
            )
            prev_blank = not raw.strip()
            start, text = i + 1, raw.strip()
            while code and text.endswith("\\") and i + 1 < len(lines):  # continuation lines
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            words = _command_words(text) if code else []
            if ([*words[_assignments(words) :], ""])[0] in COMMAND_START:
                name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
                found.append(DocCommand(name, start, " ".join(shlex.quote(w) for w in words)))
    return found


def _command_words(text: str) -> list[str]:
    """A shell line's command as its words, without a trailing ``&`` (run in the background)."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # not a command (prose in a code block)
        return []
    return words[:-1] if words[-1:] == ["&"] else words


def _indented(lines: list[str], i: int) -> bool:
    """Line i continues an indented block (the line before it is indented code too)."""
    return i > 0 and lines[i - 1].startswith("    ")


def row_for(cmd: DocCommand) -> Row:
    for row in COMMANDS:
        if re.match(row.match, cmd.command):
            return row
    raise AssertionError(
        f"{cmd}\n  is documented but not covered: add a Row to COMMANDS in "
        "tests/test_doc_commands.py "
        f"saying how to run it on CPU (run + shrink) or why it is only parsed (parse / gpu)"
    )


COLLECTED = doc_commands()
UNIQUE = list({c.text: c for c in COLLECTED}.values())  # a command documented twice runs once


def test_docs_have_commands_and_each_has_a_row():
    assert (
        len(COLLECTED) >= 20
    )  # README, data_order, paper_runs, performance, running, variable_width
    for cmd in COLLECTED:
        row_for(cmd)


def test_collector_reads_fenced_and_indented_blocks(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "Text with python inline.\n\n```bash\npython scripts/a.py --x 1   # comment\n```\n\n"
        "```yaml\npython: not a command\n```\n\n    torchrun --nproc-per-node 2 \\\n"
        "        scripts/train.py c.yaml\n"
        "    sbatch scripts/launch_slurm.sbatch c.yaml 'run.name=a b'\n\n"
        "  python indented two: prose\n"
        "\n    HOURGLASS_BLOCKS=a.b python scripts/c.py\n"
    )
    assert [(c.line, c.text) for c in doc_commands([doc])] == [
        (4, "python scripts/a.py --x 1"),
        (11, "torchrun --nproc-per-node 2 scripts/train.py c.yaml"),
        (13, "sbatch scripts/launch_slurm.sbatch c.yaml 'run.name=a b'"),
        (17, "HOURGLASS_BLOCKS=a.b python scripts/c.py"),
    ]
    assert doc_commands([doc])[-1].env == {"HOURGLASS_BLOCKS": "a.b"}
    assert doc_commands([doc])[-1].command == "python scripts/c.py"


def test_a_command_without_a_row_names_the_fix():
    with pytest.raises(AssertionError, match="add a Row to COMMANDS in tests/test_doc_commands.py"):
        row_for(DocCommand("NEW.md", 3, "python scripts/new_tool.py --go"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, demo_corpus):
    """A scratch folder that looks like the repo root to a command: its scripts and data list linked
    in, its configs copied (search.py --write regenerates some), the demo corpus cache shared; what
    a command writes stays here."""
    root = tmp_path_factory.mktemp("docs")
    shutil.copytree(REPO / "configs", root / "configs")
    for name in ("scripts", "data_order", "olmo_patches", "benchmarks"):
        (root / name).symlink_to(REPO / name)
    (root / ".cache").mkdir()
    (root / ".cache" / "demo-corpus").symlink_to(REPO / ".cache" / "demo-corpus")
    (root / "runs").mkdir()
    return root


def _script(
    argv: list[str], cwd: Path, stdout: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """``python scripts/X.py ARGS`` in this process, from ``cwd``: (exit code, stdout + stderr);
    with ``env`` (a line's assignments, read at import) in a fresh interpreter."""
    if env:
        r = run([sys.executable, *argv], timeout=900, cwd=cwd, **env)
    else:
        r = run_in_process(argv[0], *argv[1:], cwd=cwd)
    if stdout is not None:
        stdout.write_text(r.stdout)
    return r.returncode, r.stdout + r.stderr


def _flags(words: list[str]) -> list[str]:
    """The --flags of a command; a synopsis's [--flag] counts too."""
    return [w.strip("[]").split("=")[0] for w in words if w.strip("[]").startswith("--")]


def _check_parse(words: list[str], cwd: Path) -> None:
    if words[0] == "make":
        r = run(["make", "-n", *words[1:]])
        assert r.returncode == 0, r.stderr
        recipe = [
            shlex.split(line)
            for line in r.stdout.splitlines()
            if "scripts/" in line or "pytest" in line
        ]
        assert recipe, r.stdout  # the target runs a script of this repo or the suite
        for line in recipe:
            script = next((w for w in line if w.startswith("scripts/")), None)
            if script:
                code, help_text = _script([script, "--help"], cwd)
                assert code == 0, help_text
        return
    if words[:3] == ["python", "-m", "pytest"]:
        words = words[2:]
    if words[0] == "pytest":  # its paths exist, and pytest knows its flags and markers
        paths = [w for w in words[1:] if w.startswith("tests/")]
        assert all((REPO / w.split("::")[0]).exists() for w in paths), paths
        # Flags and -k/-m expressions parse on any collection: a file of one empty test stands for
        # the files named (collecting them imports torch, OLMo-core and transformers), with this
        # checkout's settings and no conftest.
        light = cwd / "test_light.py"
        light.write_text("def test_light():\n    pass\n")
        # pytest-xdist's -n N: the workers are not what is checked
        n = [i for i, w in enumerate(words) if w == "-n"]
        words = [w for i, w in enumerate(words) if not any(i in (j, j + 1) for j in n)]
        args = [w for w in words[1:] if w not in paths]
        settings = ["-c", REPO / "pyproject.toml", "--rootdir", REPO, "--noconftest"]
        r = run([sys.executable, "-m", "pytest", "--collect-only", "-q", *settings, *args, light])
        assert r.returncode in (0, 5), (
            r.stdout[-2000:] + r.stderr[-2000:]
        )  # 5: nothing selected (-m gpu on CPU collects none to run)
        return
    args = words[1:]
    code, help_text = _script([args[0], "--help"], cwd)
    assert code == 0, help_text
    if len(args) > 1 and not args[1].startswith("-"):  # a subcommand: its own flags
        code, sub_help = _script([args[0], args[1], "--help"], cwd)
        if code == 0:
            help_text += sub_help
    missing = [f for f in _flags(args) if f not in help_text]
    assert not missing, f"flags not in {args[0]} --help: {missing}"


def _plan(train_argv: list[str], nproc: int, nodes: int, cwd: Path, env: dict[str, str]) -> None:
    """scripts/train.py's part of a launch, planned for its ranks: the config loads and fits
    them."""
    assert train_argv[0] == "scripts/train.py", train_argv
    code, out = _script(
        [*train_argv, "--dry-run", "--nproc-per-node", str(nproc), "--nodes", str(nodes)],
        cwd,
        env=env,
    )
    assert code == 0, out[-3000:]
    assert f"{nproc * nodes} rank" in out


def _check_gpu(words: list[str], cwd: Path, tmp_path: Path, env: dict[str, str]) -> None:
    if words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        t = get_args_parser().parse_args(words[1:])
        nodes = int(str(t.nnodes).split(":")[-1])  # torchrun's MIN:MAX form (default 1:1)
        argv = [t.training_script, *t.training_script_args]
        if (
            t.no_python and argv[0] == "hourglass-train"
        ):  # the console command (pyproject.toml [project.scripts])
            argv[0] = "scripts/train.py"
        if t.module and argv[:2] == ["olmo_patches", "train"]:  # python -m olmo_patches train
            argv = ["scripts/train.py", *argv[2:]]
        _plan(argv, int(t.nproc_per_node), nodes, cwd, env)
    elif words[0] == "sbatch":
        from ._fake_slurm import fake_slurm

        i = words.index("scripts/launch_slurm.sbatch")
        opts = dict(zip(words[1:i:2], words[2:i:2]))
        assert set(opts) <= {"--nodes"}, f"sbatch options the test does not model: {opts}"
        slurm = fake_slurm(tmp_path)
        nodes = int(opts.get("--nodes", 1))
        r = slurm.run(*words[i + 1 :], nodes=nodes, gpus="8")
        assert r.returncode == 0, r.stderr
        assert slurm.args("srun")[1:4] == ["python", "-m", "olmo_patches.launch.torchrun"]
        preflight = slurm.args("python")
        _plan(preflight[: preflight.index("--dry-run")], 8, nodes, cwd, env)
    else:  # a GPU default of a CPU script: its flags parse
        _check_parse(words, cwd)


@pytest.mark.parametrize("cmd", UNIQUE, ids=[f"{c.doc}:{c.line}" for c in UNIQUE])
def test_documented_command(cmd, workdir, tmp_path):
    row = row_for(cmd)
    words = shlex.split(cmd.command)
    if row.how == "parse":
        _check_parse(words, workdir)
    elif row.how == "gpu":
        _check_gpu(words, workdir, tmp_path, cmd.env)
    else:
        assert words[0] == "python", cmd
        stdout = None
        if ">" in words:  # python X > FILE: FILE in the scratch folder
            stdout = workdir / words[words.index(">") + 1]
            words = words[: words.index(">")]
        code, out = _script([*words[1:], *row.shrink], workdir, stdout, cmd.env)
        assert code == 0, f"{cmd}\n{out[-3000:]}"
