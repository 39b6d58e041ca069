"""The throughput benchmark runs end to end on a tiny model and reports what it promises."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from iaa.jobs.train import bench
from iaa.jobs.modeling import precision_policy as precision
from iaa.jobs.training.step import build_optimizer, train_step
from iaa.model import build_reader, preset
from tests._model_inputs import one_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(300)
TINY = {"embed_dim": 16, "hidden_dim": 8, "state_dim": 12, "steps": 2, "gate_dim": 10}


@pytest.fixture(autouse=True)
def small_roofline(monkeypatch):
    """The roofline matmul at 256 instead of 2048: the same measurement, 500x less work; and
    ``auto`` decided by injected probe rates (a machine without bf16 units: fp32)."""
    measure = bench.matmul_gflops
    monkeypatch.setattr(bench, "matmul_gflops", lambda device, size=256, dtype=torch.float32, reps=3: measure(
        device, size=min(size, 256), reps=reps, dtype=dtype))
    monkeypatch.setattr(precision, "probed_rates", lambda: {"fp32": 100.0, "bf16": 20.0})


def test_synthetic_workload_has_the_cbt_ne_shape():
    examples = bench.synthetic_examples(400, seed=0)
    doc_lens = [len(e.doc) for e in examples]
    assert 400 < sum(doc_lens) / len(doc_lens) < 460 and min(doc_lens) >= 130 and max(doc_lens) <= 1000
    for e in examples[:20]:
        assert set(e.doc_cand[e.doc_cand >= 0].tolist()) == set(range(bench.NUM_CANDS))
        assert e.answer in range(bench.NUM_CANDS) and 3 <= len(e.query) <= 120


def test_count_flops_counts_matmuls_forward_and_backward():
    layer = torch.nn.Linear(48, 20, bias=False)
    x = torch.randn(7, 48, requires_grad=True)
    # forward x W^T, backward dx = g W and dW = g^T x: three (7 x 48 x 20) products
    assert bench.count_flops(lambda: layer(x).sum().backward()) == 3 * 2 * 7 * 48 * 20


def test_time_steps_counts_examples_and_reads_the_clock_around_the_work():
    ticks = iter([10.0, 12.5])
    calls = []
    seconds, count = bench.time_steps(calls.append, [[1, 2, 3], [4, 5]], "cpu", clock=lambda: next(ticks))
    assert (seconds, count) == (2.5, 5) and calls == [[1, 2, 3], [4, 5]]


def test_bench_run_reports_consistent_figures():
    model = "iaa"
    result = bench.run(model=model, overrides=TINY, steps=1, warmup=1, batch_size=4)
    assert result.config["kind"] == model and result.config["embed_dim"] == TINY["embed_dim"]
    assert result.device == "cpu" and result.batch_size == 4 and result.threads >= 1
    assert result.achieved_gflops == pytest.approx(
        result.flops_per_train_example * result.train_examples_per_s / 1e9, rel=1e-2, abs=2e-3)
    assert result.precision == "fp32" and set(result.flops_by_dtype) == {"fp32"}
    assert result.matmul_gflops == result.matmul_gflops_fp32
    if bench.bf16_units():
        assert result.matmul_gflops_bf16 > 0
    else:                                   # emulated bf16 has no roofline worth the name: null, and said
        assert result.matmul_gflops_bf16 is None and result.warnings == (bench.NO_BF16_UNITS,)
    assert result.roofline_fraction == pytest.approx(result.achieved_gflops / result.matmul_gflops,
                                                        rel=2e-2, abs=2e-3)
    assert result.peak_memory_bytes > 10 * 2**20                    # at least the interpreter and torch


def test_iaa_does_more_work_per_example_than_the_as_reader():
    """The AS Reader is the IAA reader's encoders plus one read: strictly fewer FLOPs, and the
    IAA reader's extra work grows with its number of inference steps T."""
    batch = bench.collate(bench.synthetic_examples(4, seed=0, vocab_size=500))
    flops = {}
    for model, steps in (("as-reader", 2), ("iaa", 2), ("iaa", 4)):
        reader = build_reader(preset("tiny", kind=model, vocab_size=500, steps=steps))
        optimizer = build_optimizer(reader, lr=1e-3, embed_l2=1e-4)
        flops[model, steps] = bench.count_flops(lambda: train_step(reader, optimizer, batch))
    assert flops["as-reader", 2] < flops["iaa", 2] < flops["iaa", 4]


def test_bf16_bench_counts_each_gemm_against_its_own_dtypes_roofline(monkeypatch):
    """The encoders' projections, their input and weight gradients and the document reads
    multiply bf16 operands; at this size the 32-row training matmuls and the recurrence stay
    fp32 (AMX needs sizes that are multiples of 32). The roofline
    fraction holds each dtype's FLOPs to that dtype's rate."""
    result = bench.run(overrides=TINY, steps=1, warmup=1, batch_size=4, precision="bf16")
    flops = result.flops_by_dtype
    assert result.precision == "bf16" and flops["bf16"] > 0 and flops["fp32"] > 0
    assert sum(flops.values()) == result.flops_per_train_example
    if bench.bf16_units():                  # without bf16 units there is no bf16 roofline to hold them to
        ideal_s = (flops["fp32"] / (result.matmul_gflops_fp32 * 1e9)
                   + flops["bf16"] / (result.matmul_gflops_bf16 * 1e9))
        assert result.roofline_fraction == pytest.approx(ideal_s * result.train_examples_per_s,
                                                            rel=2e-2, abs=2e-3)
        assert result.matmul_gflops == result.matmul_gflops_bf16
    monkeypatch.setattr(precision, "probed_rates", lambda: {"fp32": 100.0, "bf16": 400.0})
    assert bench.run(overrides=TINY, steps=1, warmup=1, batch_size=4).precision == "bf16"   # auto
    with pytest.raises(ValueError, match="precision"):
        bench.run(overrides=TINY, precision="fp16")


def test_side_by_side_script_runs():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_train.py"
    spec = importlib.util.spec_from_file_location("bench_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    result = module.main(["--rounds", "1", "--steps", "1", "--batch-size", "4", *sets])
    assert result["train_ratio"] > 0 and result["infer_ratio"] > 0


def test_a_cpu_without_bf16_units_gets_no_bf16_roofline_and_is_told(monkeypatch):
    assert not bench.bf16_units("cpu", "avx2 avx512f fma sse4_2")          # AMD Zen 3: no AVX-512 BF16
    assert bench.bf16_units("cpu", "avx512f avx512_bf16") and bench.bf16_units("cpu", "amx_bf16 amx_tile")
    assert bench.bf16_units("cuda", "")
    timed = []
    monkeypatch.setattr(bench, "matmul_gflops", lambda device, size, reps, dtype: timed.append(dtype) or 50.0)
    monkeypatch.setattr(bench, "bf16_units", lambda device="cpu", features=None: False)
    assert bench.matmul_rooflines("cpu", size=64) == {"fp32": 50.0, "bf16": None}
    assert set(timed) == {torch.float32}                                  # bf16 never timed
    result = bench.run(overrides=TINY, steps=1, warmup=1, batch_size=4, precision="fp32", matmul_size=64)
    assert result.matmul_gflops_bf16 is None and "no bf16 units" in result.warnings[0]
    assert result.roofline_fraction > 0


def test_the_roofline_matmul_is_large_enough_to_be_compute_bound_on_a_gpu(monkeypatch):
    assert bench.roofline_size("cuda") == bench.roofline_size("cuda:1") == 8192
    assert bench.roofline_size("cpu") == 2048
    sizes = []
    monkeypatch.setattr(bench, "matmul_rooflines", lambda device, size: sizes.append(size) or {"fp32": 50.0, "bf16": 50.0})
    bench.run(overrides=TINY, steps=1, warmup=1, batch_size=4, precision="fp32")
    assert sizes == [2048]                                               # the CPU's, when none is asked for


@pytest.mark.slow
def test_the_memory_script_trains_both_sides_and_reports_them(tmp_path):
    """``benchmarks/bench_memory.py``: two processes train the preset's reader side by side; each
    reports every ``--report-every`` steps, and the summary holds both sides' peaks and the seconds' ratio."""
    from tests._tiny import make_tiny_prepared

    prepared = make_tiny_prepared(tmp_path / "tiny")
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_memory.py"
    out = tmp_path / "memory.json"
    subprocess.run([sys.executable, str(script), "--data", str(prepared), "--dataset", "cbt-ne", "--model", "iaa",
                    "--steps", "40", "--report-every", "20", "--json", str(out)], check=True, capture_output=True,
                   text=True)
    result = json.loads(out.read_text())
    assert [row["step"] for row in result["rows"]["padded"]] == [20, 40] == [
        row["step"] for row in result["rows"]["as-loaded"]]
    assert all(result["peak_mb"][side] > 50 for side in ("padded", "as-loaded"))
    assert result["seconds_ratio_padded_over_loaded"] > 0


def test_the_bench_settings_are_runs_keywords() -> None:
    import dataclasses
    import inspect

    keywords = set(inspect.signature(bench.run).parameters) - {"model", "overrides", "device"}
    assert {f.name for f in dataclasses.fields(bench.BenchSettings)} == keywords


@pytest.mark.parametrize("given, named", [
    ("model.nope=1", "'model.nope'"),
    ("model.embed_dim=-1", "model.embed_dim must be"),
    ("bench.steps=abc", "bench.steps: expected an integer"),
    ("bench.batch_size=0", "bench.batch_size must be at least 1"),
    ("bench.precision=fp16", "bench.precision: expected one of"),
    ("bench.nope=3", "'bench.nope'"),
    ("train.lr=0.1", "['train']"),
], ids=["model-key", "model-range", "bench-type", "bench-range", "bench-choice", "bench-key", "section"])
def test_a_bad_setting_is_one_error_line_before_anything_is_timed(given: str, named: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from _faults import assert_says
    from iaa.cli import cli

    monkeypatch.setattr(bench, "run", lambda **kwargs: pytest.fail("timed a refused setting"))
    result = CliRunner().invoke(cli, ["bench", "--set", given, "--workdir", str(tmp_path)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert_says(result.stderr, "Error:", named)


def test_an_unwritable_work_folder_is_refused_before_anything_is_timed(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from _faults import assert_says
    from iaa.cli import cli

    monkeypatch.setattr(bench, "run", lambda **kwargs: pytest.fail("timed before the work folder was checked"))
    (tmp_path / "a-file").write_text("x")
    result = CliRunner().invoke(cli, ["bench", "--workdir", str(tmp_path / "a-file" / "w")])
    assert result.exit_code == 1
    assert_says(result.stderr, "Error:", "a-file")
