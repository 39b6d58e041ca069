"""The CUDA path: training, resume, CPU evaluation of a GPU checkpoint, cuDNN's GRU, the benchmark.

Marked ``gpu``: ``pytest -m gpu`` on a machine with a CUDA device; elsewhere every test skips,
saying why. Needs no Ray and no MLflow (the GPU machines may lack them).

Exactness tests compare fp32 with fp32: TF32, on by default in cuDNN (and so in its GRU), is
off in them (the ``no_tf32`` fixture).

Tolerances: GPU runs are not bitwise deterministic (cuDNN's GRU and atomic adds in index
kernels reorder float sums), so where the CPU tests demand equality these allow float noise
that a few dozen Adam steps amplify: 1e-3 absolute / 1e-2 relative on parameters, 1e-4 on
log-probabilities of one forward pass.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from iaa.jobs.modeling import checkpoint

from iaa.jobs.datasets import resolve
from iaa.jobs.train import train as train_job
from iaa.jobs.evaluation.evaluate import score_batches
from iaa.model.encoder import BiGRUEncoder
from iaa.model.kernels import gru_kernels
from iaa.model.kernels.fused_gru import FusedEncoder
from tests._tiny import TINY_SETS, kill_after_checks, make_tiny_prepared

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
PARAM_TOL = dict(atol=1e-3, rtol=1e-2)


@pytest.fixture(scope="module")
def cuda() -> str:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False); run `pytest -m gpu` on a GPU machine")
    return "cuda"


@pytest.fixture
def no_tf32():
    """TF32 off in matmuls and cuDNN for the test: CPU and CUDA both compute in fp32."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="module")
def tiny(cuda: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _cfg(prepared: Path, *extra: str):
    return resolve.job_config("cbt-ne", prepared, sets=(*TINY_SETS, *extra))


def _params(path: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(path)["model"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_few_training_steps_on_cuda(tiny, cuda, tmp_path, precision) -> None:
    cfg = _cfg(tiny, f"train.precision={precision}", "train.max_epochs=1")
    result = train_job.run(cfg, tiny, tmp_path / "run", device=cuda, show_progress=False)
    assert result.steps == 12 and result.stop_reason == "max-epochs"
    assert 0.0 <= result.valid_acc <= 1.0 and math.isfinite(result.metrics["train_loss"])
    state = checkpoint.load(Path(result.checkpoint))
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_kill_and_resume_on_cuda_equals_an_uninterrupted_run(tiny, cuda, tmp_path, no_tf32) -> None:
    cfg = _cfg(tiny, "train.check_every=3")
    full = train_job.run(cfg, tiny, tmp_path / "full", device=cuda, show_progress=False)
    run_dir = tmp_path / "killed"
    kill_after_checks(cfg, tiny, run_dir, checks=2, device=cuda)
    resumed = train_job.run(cfg, tiny, run_dir, resume=True, device=cuda, show_progress=False)
    assert resumed.steps == full.steps
    a, b = _params(tmp_path / "full/checkpoints/last.pt"), _params(run_dir / "checkpoints/last.pt")
    for name in a:
        torch.testing.assert_close(b[name], a[name], **PARAM_TOL, msg=name)


def test_a_gpu_checkpoint_resumes_on_the_cpu(tiny, cuda, tmp_path) -> None:
    cfg = _cfg(tiny, "train.max_epochs=1")
    train_job.run(cfg, tiny, tmp_path / "run", device=cuda, show_progress=False)
    longer = _cfg(tiny, "train.max_epochs=2")
    result = train_job.run(longer, tiny, tmp_path / "run", resume=True, device="cpu", show_progress=False)
    assert result.steps == 24 and result.stop_reason == "max-epochs"


def test_a_gpu_trained_checkpoint_evaluates_on_the_cpu(tiny, cuda, tmp_path, no_tf32) -> None:
    from iaa.data.loading.loader import PreparedData, iter_batches

    result = train_job.run(_cfg(tiny, "train.max_epochs=1"), tiny, tmp_path / "run", device=cuda, show_progress=False)
    path = Path(result.checkpoint)
    raw = torch.load(path, weights_only=True)                                # no map_location
    assert all(t.device.type == "cpu" for t in raw["model"].values())
    valid = PreparedData.open(tiny).table("valid")
    scores = {}
    for device in ("cpu", cuda):
        model, _, _ = checkpoint.load_model(path, device=device)
        scores[device] = score_batches(model, iter_batches(valid, 16, seed=0, epoch=0, shuffle=False), device)
    assert scores["cpu"][:2] == scores[cuda][:2]                             # correct, total
    assert scores["cpu"][2] == pytest.approx(scores[cuda][2], rel=1e-4)      # summed nll


def test_cudnn_gru_equals_the_cpu_fused_gru(cuda, no_tf32) -> None:
    torch.manual_seed(0)
    encoder = BiGRUEncoder(24, 16)
    with torch.no_grad():
        for param in encoder.parameters():
            param.normal_(0.0, 0.3)
    mask = torch.arange(30) < torch.tensor([30, 7, 22, 1, 16]).unsqueeze(1)
    x = torch.randn(5, 30, 24)
    weight = torch.randn(5, 30, 32)
    outputs = {}
    for device in ("cpu", cuda):
        enc = encoder.to(device)
        xd = x.to(device).requires_grad_()
        fused = FusedEncoder("fp32", gru_kernels.load()).encode if device == "cpu" else None
        states, final = enc(xd, mask.to(device), encode=fused)
        grads = torch.autograd.grad((states * weight.to(device)).sum() + final.sum(), [xd, *enc.parameters()])
        outputs[device] = [t.detach().cpu() for t in (states, final, *grads)]
    for a, b in zip(outputs[cuda], outputs["cpu"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bench_cli_on_cuda(cuda, precision) -> None:
    from iaa.cli import cli

    args = ["bench", "--device", "cuda", "--json", "--set", f"bench.precision={precision}",
            "--set", "bench.steps=3", "--set", "bench.warmup=1"]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["device"] == "cuda" and out["precision"] == precision
    assert out["train_examples_per_s"] > 0 and out["peak_memory_bytes"] > 0



def test_bf16_encoders_run_the_gru_in_bf16_or_fp32_never_fp16(cuda) -> None:
    """Under ``train.precision=bf16`` the cuDNN GRU runs in the dtype the encoder chooses, even
    under the caller's bf16 autocast: bf16 with bf16 weights on cuDNN >= 9.13, else fp32;
    gradients reach the fp32 parameters and the input in fp32."""
    from iaa.model.encoder import rnn_dtype

    torch.manual_seed(0)
    encoder = BiGRUEncoder(24, 16).to(cuda)
    x = torch.randn(5, 30, 24, device=cuda, requires_grad=True)
    mask = (torch.arange(30) < torch.tensor([30, 7, 22, 1, 16]).unsqueeze(1)).to(cuda)
    expected = rnn_dtype("cuda", "bf16")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        states, final = encoder(x, mask, mask.sum(1).cpu(), precision="bf16")
    assert expected in (torch.bfloat16, torch.float32)
    version = torch.backends.cudnn.version()
    assert expected == (torch.bfloat16 if version >= 91300 else torch.float32), version
    assert states.dtype == expected and final.dtype == expected
    grads = torch.autograd.grad(states.float().sum() + final.float().sum(), [x, *encoder.parameters()])
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
