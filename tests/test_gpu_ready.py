"""GPU readiness on a CPU: which attention backend each config resolves to, data loader workers
(same batches, bit-identical resume), and the CPU path of scripts/gpu_check.py."""

import json

import pytest
import torch
from olmo_core.nn.attention import flash_attn_api

from olmo_patches.config import ConfigError, attention_backend, load_spec
from olmo_patches.train import train
from olmo_patches.train.batch_trace import read_batch_trace
from olmo_patches.train.metrics import read_metrics
from olmo_patches.train.checkpoints import load_model_state

from .conftest import REPO, run_in_process, run_script, tiny_overrides

CONFIGS = ["113M/baseline", "113M/hourglass", "113M/variable-width", "1B/baseline", "1B/hourglass", "1B/olmo2", "demo/baseline"]


def _load(name, *extra):
    return load_spec(REPO / "configs" / f"{name}.yaml", ["train.hardware=none", *extra])


def _head_dims(spec):
    """head_dim of every layer, from the config's numbers: d_model (or w_l) / n_heads."""
    m = spec.model
    widths = m.resolved_widths if m.block == "variable_width" else [m.d_model] * m.n_layers
    return [w // m.n_heads for w in widths]


@pytest.fixture
def flash(monkeypatch):
    """Make OLMo-core see flash-attn 2 (and optionally 3) as imported; which module it is never matters here."""

    def install(*versions):
        monkeypatch.setattr(flash_attn_api, "flash_attn_2", torch if 2 in versions else None)
        monkeypatch.setattr(flash_attn_api, "flash_attn_3", torch if 3 in versions else None)

    return install


@pytest.mark.parametrize("name", CONFIGS)
def test_auto_backend_per_config(name, flash):
    spec = _load(name, "train.precision=bf16")  # the demo config says fp32 (CPU)
    dims = _head_dims(spec)
    flash()  # no flash-attn: OLMo-core's default everywhere
    assert attention_backend(spec, "cuda").name == "torch"
    assert attention_backend(spec, "cpu").name == "torch"
    flash(2)  # flash-attn 2 takes head dims up to 256 (its README)
    assert attention_backend(spec, "cuda").name == ("flash_2" if max(dims) <= 256 else "torch")
    assert attention_backend(spec, "cpu").name == "torch"
    flash(2, 3)  # flash-attn 3 (Hopper) compiles head dims 64, 96, 128, 192, 256
    expected = "flash_3" if set(dims) <= {64, 96, 128, 192, 256} else "flash_2"
    assert attention_backend(spec, "cuda").name == expected
    fp32 = _load(name, "train.precision=fp32")
    assert attention_backend(fp32, "cuda").name == "torch"  # flash kernels take bf16/fp16 only


def test_explicit_backends(flash, monkeypatch):
    flash()
    spec = _load("113M/baseline", "model.attention_backend=flash_2")
    assert attention_backend(spec, "cpu").name == "torch"  # OLMo-core's own CPU fallback
    with pytest.raises(ConfigError, match="model.attention_backend=flash_2.*does not import"):
        attention_backend(spec, "cuda")
    with monkeypatch.context() as m:  # the same config loaded on a CUDA machine without flash-attn
        m.setattr(torch.cuda, "is_available", lambda: True)
        with pytest.raises(ConfigError, match="command line: model.attention_backend=flash_2: flash_2 does not import"):
            _load("113M/baseline", "model.attention_backend=flash_2")
    flash(2)
    assert attention_backend(spec, "cuda").name == "flash_2"
    assert attention_backend(_load("113M/baseline", "model.attention_backend=torch"), "cuda").name == "torch"
    with pytest.raises(ConfigError, match="command line: model.attention_backend=flash_2: flash attention needs"):
        _load("113M/baseline", "model.attention_backend=flash_2", "train.precision=fp32")
    with pytest.raises(ConfigError, match="model.attention_backend=xformers"):
        _load("113M/baseline", "model.attention_backend=xformers")


def test_backend_reaches_the_built_model_and_the_dry_run(tmp_path, demo_corpus):
    """A flash config built on a CPU: the Attention modules run torch SDPA (OLMo-core's fallback)."""
    from olmo_core.nn.attention.backend import TorchAttentionBackend

    from olmo_patches.train import build_experiment, resolve_data

    spec = load_spec(REPO / "configs" / "demo" / "baseline.yaml", tiny_overrides(tmp_path, "train.max_steps=1", "train.precision=bf16", "model.attention_backend=flash_2"))
    exp = build_experiment(spec, resolve_data(spec))
    assert exp.model.block.sequence_mixer.backend == "torch"
    model = exp.model.build()
    assert all(isinstance(b.attention.backend, TorchAttentionBackend) for b in model.blocks.values())
    r = run_in_process("train.py", str(REPO / "configs" / "113M" / "hourglass.yaml"), "train.hardware=none", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "attention backend" in r.stdout and "torch (auto: no CUDA device)" in r.stdout


# --- data loader workers --------------------------------------------------------------------------

RUN = ["train.max_steps=6", "run.save_interval=3", "run.ephemeral_save_interval=null", "run.trace_batches=true"]


def _spec(folder, *extra):
    return load_spec(REPO / "configs" / "demo" / "baseline.yaml", tiny_overrides(folder, *RUN, *extra))


def test_workers_keep_the_batches_and_resume_bit_identical(tmp_path_factory, demo_corpus):
    """2 loader processes (prefetch 3), stopped at step 3 and resumed, against the in-process loader
    run straight through: the same instances at every step, the same losses, the same final weights.
    (OLMo-core starts workers with spawn: each run pays their imports, so the test has two runs.)"""
    serial, workers = tmp_path_factory.mktemp("serial"), tmp_path_factory.mktemp("workers")
    train(_spec(serial, "data.num_workers=0"))
    train(_spec(workers, "data.num_workers=2", "data.prefetch_factor=3", "run.stop_at_step=3"))
    train(_spec(workers, "data.num_workers=2", "data.prefetch_factor=3"))
    trace = read_batch_trace(serial)
    assert sorted(trace) == [1, 2, 3, 4, 5, 6] and read_batch_trace(workers) == trace
    losses = {s: m["train/CE loss"] for s, m in read_metrics(serial).items() if "train/CE loss" in m}
    assert {s: m["train/CE loss"] for s, m in read_metrics(workers).items() if "train/CE loss" in m} == losses
    a, b = load_model_state(serial / "step6"), load_model_state(workers / "step6")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_worker_keys_are_checked(tmp_path):
    for bad, key in (("data.num_workers=-1", "data.num_workers=-1"), ("data.prefetch_factor=2", "data.prefetch_factor=2")):
        with pytest.raises(ConfigError, match=f"command line: {key}"):
            _spec(tmp_path, bad, "data.num_workers=0" if "prefetch" in bad else "data.prefetch_factor=null")


# --- scripts/gpu_check.py, CPU path -----------------------------------------------------------------


def test_gpu_check_cpu_tiny(tmp_path):
    r = run_in_process("gpu_check.py", "--device", "cpu", "--tiny", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {f"{c['section']}: {c['name']}": c for c in result["checks"]}
    # Every row passed, but float8's tokens/s: under torchao's emulation (no float8 matmuls) it is reported, not judged.
    not_judged = {n for n, c in checks.items() if c["passed"] is None}
    assert not_judged == {f"float8: {m}: tokens/s float8 / bf16" for m in ("1B baseline", "1B hourglass K4 d_h 2048")}, not_judged
    assert all(c["passed"] for n, c in checks.items() if n not in not_judged), [n for n, c in checks.items() if c["passed"] is False]
    blocks = ["baseline pre", "baseline post", "hourglass pre", "hourglass post",
              "variable width carry_forward", "variable width zero", "variable width learned"]
    for block in blocks:
        logits = checks[f"bf16 vs fp32: {block}: logits"]
        # bf16 really ran (errors well above fp32's 2^-24), and stayed within 16 bf16 roundoffs (2^-8 each).
        assert 2.0**-16 < logits["error"] <= 16 * 2.0**-8, logits
        assert f"bf16 vs fp32: {block}: gradients (worst tensor)" in checks
    # The attention rows at --tiny's three head dims of the shipped configs: the 113M hourglass K4-L6-exact's
    # 146 (d_model 1314 / 9 heads) is not a multiple of 8; the 403M's 218 is the largest; logits and gradients each.
    kernels = [c for c in result["checks"] if c["section"] == "attention kernels"]
    dims = sorted({int(c["name"].split("head_dim ")[1].split(":")[0]) for c in kernels})
    assert len(kernels) == 2 * len(dims) == 6 and any(d % 8 for d in dims) and max(dims) >= 218, dims
    assert all(2.0**-16 < c["error"] and "stands in" in c["detail"] for c in kernels)
    for block in ("baseline pre", "hourglass pre", "variable width learned"):  # compiled, and trained 3 AdamW steps
        for row in ("compiled vs eager: logits", "compiled vs eager: gradients (worst tensor)", "loss after 3 AdamW steps, compiled vs eager"):
            assert checks[f"compile: {block}: {row}"]["error"] == 0.0  # aot_eager runs the eager kernels
        assert int(checks[f"compile: {block}: compiled vs eager: logits"]["detail"].split(", ")[1].split()[0]) >= 1
    resume = [c for c in result["checks"] if c["section"] == "resume"]
    assert [c["name"].split(":")[0] for c in resume] == ["stopped at step 2, resumed to 4", "AdamW state at step 4 vs uninterrupted (117 tensors"]
    assert all(c["error"] == 0.0 and c["detail"] == "bit-identical" for c in resume)  # one CPU process is deterministic
    runs = {(t["scale"], t["variant"]): t for t in result["train"]}
    assert set(runs) == {("tiny", "baseline"), ("tiny", "hourglass")}
    base, hourglass = runs["tiny", "baseline"], runs["tiny", "hourglass"]
    assert base["tokens_per_s"] > 0 and base["ratio"] == 1.0
    assert hourglass["ratio"] == pytest.approx(hourglass["tokens_per_s"] / base["tokens_per_s"])
    assert base["mfu"] is None and base["peak_mem_gib"] is None and base["estimate_gib"] > 0
    assert "| tiny | hourglass | 0 of 1 |" in (tmp_path / "gpu_check.md").read_text()
    float8 = [c for c in result["checks"] if c["section"] == "float8"]
    assert [c["name"].split(":")[0] for c in float8] == ["1B baseline"] * 2 + ["1B hourglass K4 d_h 2048"] * 2
    for speed, loss in zip(float8[::2], float8[1::2]):
        assert speed["error"] is None and "emulation: not judged" in speed["detail"]  # no float8 matmuls on CPU
        assert 0 < loss["error"] <= 0.05 and loss["passed"], loss  # float8 really ran, close to bf16


def test_gpu_check_fails_without_flash_on_cuda(flash, tmp_path):
    """On a CUDA device without flash-attn the kernel rows fail (the run exits 1); --no-flash skips
    them, saying so; with flash-attn present the kernel is the trainer's own choice."""
    from olmo_patches.report.gpu_check import Context, flash_backend, to_markdown, GpuCheck

    cuda = Context(torch.device("cuda"), tmp_path)
    flash()
    name, row = flash_backend(cuda, [128])
    assert name is None and row.passed is False and "--no-flash" in row.detail
    assert "FAIL" in to_markdown(GpuCheck("cuda", torch.__version__, [row])) and GpuCheck("cuda", "", [row]).failed == [row]
    name, row = flash_backend(Context(torch.device("cuda"), tmp_path, flash=False), [128])
    assert name is None and row.passed is None and row.detail.startswith("--no-flash")
    flash(2)
    assert flash_backend(cuda, [128]) == ("flash_2", None) and flash_backend(cuda, [146]) == ("flash_2", None)
    flash(2, 3)
    assert flash_backend(cuda, [128]) == ("flash_3", None) and flash_backend(cuda, [146]) == ("flash_2", None)
    assert flash_backend(Context(torch.device("cpu"), tmp_path), [128]) == ("torch", None)  # the CPU stand-in


def test_gpu_check_trainer_under_torchrun(tmp_path):
    """--nproc-per-node 2: the trainer steps under torchrun (FSDP2 over gloo here), merged by the
    launching process into one result, a row per rank with its memory estimate for 2 ranks."""
    from olmo_patches.report.gpu_check import from_json, to_json

    r = run_script("gpu_check.py", "--device", "cpu", "--tiny", "--only", "trainer", "--variant", "baseline", "--nproc-per-node", "2",
                   "--out", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "gpu_check.json").read_text()
    result = from_json(text)
    assert to_json(result) == text and result.checks == []
    assert [(t.variant, t.rank, t.world_size) for t in result.train] == [("baseline", 0, 2), ("baseline", 1, 2)]
    assert all(t.micro_batch == 2 and t.estimate_gib > 0 and t.tokens_per_s > 0 and t.ratio == 1.0 for t in result.train)
    assert "| tiny | baseline | 1 of 2 |" in (tmp_path / "gpu_check.md").read_text()
