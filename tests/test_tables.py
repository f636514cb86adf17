"""Tables and figures from real tiny CPU runs, against the numbers in paper_results.yaml."""

import csv
import math

import pytest
import yaml
from PIL import Image

from olmo_patches.config import load_spec, spec_to_yaml
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.launch.run_folder import read_metrics
from olmo_patches.report.tables import (
    NO_NUMBER,
    NOT_RUN,
    build_tables,
    load_runs,
    paper_results,
    write_tables,
)
from olmo_patches.train import train

from .conftest import REPO, run_in_process, run_script, tiny_overrides

# end to end: runs trained, processes or ranks started (make test-fast leaves them out)
pytestmark = pytest.mark.slow

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"
# Tiny stand-ins named like paper runs, so that they land in the paper's rows.
RUNS = {
    "113M-baseline": dict(block="baseline"),
    "113M-hourglass-K8-dh384": dict(block="hourglass"),  # tiny: K=2, d_h=16 (conftest)
    "113M-hourglass-K1-L06-d1368-dh694": dict(
        block="hourglass", extra=["model.K=1", "model.n_layers=1"]
    ),
}


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory, demo_corpus):
    root = tmp_path_factory.mktemp("runs")
    for name, how in RUNS.items():
        extra = [
            "train.max_steps=4",
            "run.save_interval=1000",
            "run.ephemeral_save_interval=null",
            f"run.name={name}",
        ]
        train(
            load_and_resolve(
                BASELINE,
                tiny_overrides(root / name, *extra, *how.get("extra", []), block=how["block"]),
            )
        )
    return root


def _row(rows, **match):
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, rows)
    return found[0]


def _check_the_113M_ablations(tables) -> None:
    """The controlled 113M table, the K sweep and the d_h/d_model sweep beside the paper's
    numbers."""
    # Controlled 113M: the K=8 stand-in has its number and the paper's 36.179.
    row = _row(tables["controlled_113M"], run="113M-hourglass-K8-dh384")
    assert row["paper"] == "36.179" and row["val PPL"] != NOT_RUN and row["K"] == 2
    # K ablation: every config of the sweep is a row; the K=1 one was run, with the paper's 40.153.
    k_rows = tables["ablation_K"]
    assert len(k_rows) == len(
        list((REPO / "configs/113M/ablations/k-sweep-unmatched").glob("*.yaml"))
    )
    row = _row(k_rows, run="113M-hourglass-K1-L06-d1368-dh694")
    assert row["val PPL"] != NOT_RUN and row["paper"] == "40.153" and row["K"] == 1
    assert all(
        r["val PPL"] == NOT_RUN for r in k_rows if r["run"] != "113M-hourglass-K1-L06-d1368-dh694"
    )
    # K=4 of the 113M sweep is its base, the paper's reallocation run (35.101); K=2 has no number.
    assert (
        _row(k_rows, K=4)["paper"].startswith("35.101 (the reallocation run")
        and _row(k_rows, K=2)["paper"] == NO_NUMBER
    )
    # The d_h/d_model sweep: its 0.400 point reads as the paper's best band, 0.296 as clearly worse.
    dh = {r["d_h/d_model"]: r["paper"] for r in tables["ablation_d_h_ratio"]}
    assert dh["0.400"].startswith("0.38-0.42: about 0.4: best") and dh["0.296"].endswith(
        "clearly worse"
    ), dh


def _check_downstream_and_variable_width(tables) -> None:
    """Downstream cells not run beside the paper's, the hourglass runs, and paper 2's rows."""
    # Downstream was not evaluated in the tiny runs: shown as not run beside the paper's 0.453.
    # Every (task, size) cell: 7 tasks x 4 sizes x 2 variants; the paper's text gives 4 cells, each
    # variant.
    rows = tables["downstream"]
    assert len(rows) == 7 * 4 * 2 and sum(r["paper"] != NO_NUMBER for r in rows) == 8
    assert _row(rows, task="PIQA", size="403M", variant="hourglass")["paper"] == NO_NUMBER
    assert _row(rows, task="SciQ", size="1074M", variant="hourglass")["paper"] == "0.825"
    row = _row(tables["downstream"], task="ARC-Easy", size="113M", variant="baseline")
    assert row["ours"] == NOT_RUN and row["paper"] == "0.453"
    assert {r["run"] for r in tables["hourglass_runs"]} == {
        "113M-hourglass-K8-dh384",
        "113M-hourglass-K1-L06-d1368-dh694",
    }
    assert _row(tables["variable_width"], run="paper2-500M-zero")["paper"] == "3.124"
    # The 3B MoE row (paper 2, docs/papers.md): 2.726 -> 2.710, -4.6% FLOPs, -10.9% mean width.
    assert _row(tables["variable_width"], run="paper2-3B-MoE-baseline")["paper"] == "2.726"
    moe_x = _row(tables["variable_width"], run="paper2-3B-MoE-x")
    assert (moe_x["size"], moe_x["paper"], moe_x["paper FLOPs"], moe_x["paper mean width"]) == (
        "3B-MoE",
        "2.710",
        "-4.6%",
        "-10.9%",
    )


def test_tables_show_runs_beside_paper_numbers(runs_root):
    runs = load_runs([runs_root])
    assert sorted(runs) == sorted(RUNS)
    tables = build_tables(runs)
    paper = paper_results()
    # The baseline's PPL is exp of its last validation CE loss, read independently from
    # metrics.jsonl.
    metrics = read_metrics(runs_root / "113M-baseline")
    last_val = [
        m["eval/lm/val/CE loss"] for _, m in sorted(metrics.items()) if "eval/lm/val/CE loss" in m
    ][-1]
    row = _row(tables["validation_ppl"], run="113M-baseline")
    assert float(row["val PPL"]) == pytest.approx(math.exp(last_val), abs=1e-3)
    reported = next(
        r["ppl"] for r in paper["hourglass"]["validation_ppl"] if r["run"] == "113M-baseline"
    )
    assert row["paper"] == f"{reported:.3f}" == "36.441"
    assert float(row["diff"]) == pytest.approx(float(row["val PPL"]) - 36.441, abs=2e-3)
    assert row["steps"] == "4"
    # Runs not made: "not run", the paper's number still shown.
    missing = _row(tables["validation_ppl"], run="1B-olmo2")
    assert missing["val PPL"] == NOT_RUN and missing["paper"] == "20.466" and missing["diff"] == ""
    _check_the_113M_ablations(tables)
    _check_downstream_and_variable_width(tables)


def test_make_tables_script_writes_markdown_csv_and_figures(runs_root, tmp_path):
    out = tmp_path / "tables"
    r = run_in_process("make_tables.py", str(runs_root), "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    md = (out / "validation_ppl.md").read_text()
    assert (
        md.startswith("| size | variant | run |")
        and "| 113M | baseline | 113M-baseline | 4 |" in md
    )
    with open(out / "validation_ppl.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(paper_results()["hourglass"]["validation_ppl"])
    assert "## ablation_K" in (out / "tables.md").read_text()
    for name in ("u_curve", "ppl_vs_K", "ppl_vs_dh_ratio", "loss_curves", "param_split"):
        with Image.open(out / f"{name}.png") as im:
            assert im.size[0] > 300 and im.size[1] > 200
    bad = run_script(
        "make_tables.py", str(tmp_path / "nope"), "--out", str(out)
    )  # the process: exit 2, one line
    assert bad.returncode == 2 and "no such folder" in bad.stderr


def test_write_tables_marks_every_paper_row_not_run_without_runs(tmp_path):
    tables = build_tables({})
    write_tables(tables, tmp_path)
    assert all(r["val PPL"] == NOT_RUN for r in tables["validation_ppl"])
    assert (
        tables["hourglass_runs"] == []
        and (tmp_path / "hourglass_runs.md").read_text() == "(no runs)\n"
    )


def test_paper2_rows_compare_gaps_not_absolute_losses(tmp_path):
    """Paper 2 trained on DCLM with cl100k, the runs on OLMo-2's mix with dolma2: the x row's diff
    is the run's gap to its own baseline minus the paper's gap (2B: 2.726 - 2.751 = -0.025), and
    each row names both sides' data."""
    from olmo_patches.report.tables import Run, hourglass_runs_table, variable_width_table

    def run(name, loss, *shape):
        """A run as training records it, of the demo baseline's size on OLMo-2's data."""
        data = ["data.source=olmo2_stage1", "data.tokenizer=dolma2", "model.vocab_size=100352"]
        spec = load_spec(BASELINE, [*data, *shape, f"run.name={name}"])
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(spec_to_yaml(spec))
        config = yaml.safe_load(spec_to_yaml(spec))
        return Run(
            tmp_path / name, config, {100: {"eval/lm/wikitext_103-validation/CE loss": loss}}
        )

    vw = "model.block=variable_width"
    runs = {
        "paper2-2B-baseline": run("paper2-2B-baseline", 3.000, vw),
        "paper2-2B-x": run("paper2-2B-x", 2.990, vw),
    }
    rows = variable_width_table(runs, paper_results())
    x = _row(rows, run="paper2-2B-x")
    assert (x["gap to own baseline"], x["paper gap"], x["diff"]) == ("-0.010", "-0.025", "+0.015")
    assert x["data (run / paper)"] == "olmo2_stage1, dolma2 / DCLM, cl100k"
    assert _row(rows, run="paper2-2B-baseline")["diff"] == ""
    assert (
        _row(rows, run="paper2-1B-x")["diff"] == ""
        and _row(rows, run="paper2-1B-x")["paper gap"] == "-0.036"
    )
    # a variable-width run with an hourglass FFN (K=2) is no point of paper 1's K sweeps; a
    # hourglass run is
    vw_hourglass = [vw, "model.ffn=hourglass", "model.K=2", "model.d_h_ratio=0.5"]
    runs["vw-hourglass"] = run("vw-hourglass", 3.0, *vw_hourglass)
    runs["hourglass"] = run("hourglass", 3.0, "model.block=hourglass", "model.K=2", "model.d_h=32")
    assert [r["run"] for r in hourglass_runs_table(runs)] == ["hourglass"]
