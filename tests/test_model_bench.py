"""The throughput benchmark runs end to end on a tiny model and reports what it promises."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from iaa.jobs import bench
from tests._model_inputs import one_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(300)
TINY = {"embed_dim": 16, "hidden_dim": 8, "state_dim": 12, "steps": 2, "gate_dim": 10}


def test_synthetic_workload_has_the_cbt_ne_shape():
    examples = bench.synthetic_examples(400, seed=0)
    doc_lens = [len(e.doc) for e in examples]
    assert 400 < sum(doc_lens) / len(doc_lens) < 460 and min(doc_lens) >= 130 and max(doc_lens) <= 1000
    for e in examples[:20]:
        assert set(e.doc_cand[e.doc_cand >= 0].tolist()) == set(range(bench.NUM_CANDS))
        assert e.answer in range(bench.NUM_CANDS) and 3 <= len(e.query) <= 120


@pytest.mark.parametrize("model", ["iaa", "as-reader"])
def test_bench_run_reports_rates(model):
    result = bench.run(model=model, overrides=TINY, steps=1, warmup=1, batch_size=4)
    for key in ("train_examples_per_s", "infer_examples_per_s", "flops_per_train_example",
                "achieved_gflops", "matmul_gflops"):
        assert result[key] > 0, key
    assert result["config"]["kind"] == model and result["device"] == "cpu" and result["threads"] >= 1


def test_bf16_on_cpu_means_bf16_projection_gemms_not_autocast():
    result = bench.run(overrides=TINY, steps=1, warmup=1, batch_size=4, precision="bf16")
    assert result["precision"] == "bf16" and result["config"]["bf16_projections"] is True
    assert bench.run(overrides=TINY, steps=1, warmup=1, batch_size=4)["precision"] == "fp32"
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
