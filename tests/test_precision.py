"""``train.precision=bf16``: forward, backward and an Adam step of a bf16 reader on the CPU.

Precision is the reader's argument (``build_reader(cfg, device, precision)``); the same code
runs on a GPU (tests/test_gpu.py). Each model kind, on the fast and on the reference path, must
run without a dtype error, keep parameters, gradients and Adam's state in fp32 (precision
changes only the compute dtype of the forward pass), return fp32 log-probabilities, and stay
within bf16's rounding of the fp32 result. The caller's autocast changes nothing.

Tolerances: bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); a forward and backward
pass chain a few dozen rounded matmuls (the reference path runs even the GRU recurrence in
bf16), so outputs are held to 0.01 in log-probability (~1%
in probability) and each parameter's gradient to 5% relative error in norm.
"""

from __future__ import annotations

import pytest
import torch

from iaa.jobs.training.step import build_optimizer, train_step
from iaa.model import MODEL_KINDS, build_reader, nll_loss, preset
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)

PATHS = {
    "fast": {},
    "reference": dict(fused_gru=False, batched_read_grad=False, sparse_embedding_grad=False, fast_dropout=False),
}
LOG_P_ATOL = 0.01
GRAD_RTOL = 0.05


def _model(kind: str, path: str, precision: str = "fp32") -> torch.nn.Module:
    """A tiny reader whose weights are scaled up so that attention is far from uniform (at the
    initial scale every read averages, and bf16 would hardly change anything)."""
    torch.manual_seed(0)
    model = build_reader(preset("tiny", vocab_size=40, kind=kind, dropout=0.0, steps=3, **PATHS[path]),
                         precision=precision)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(3.0)
    return model


def _dense(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_dense() if grad.is_sparse else grad


def _forward_backward(model, batch, autocast: bool = False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # the caller's, if any
        log_p = model(batch).log_probs                                  # (B, C)
    nll_loss(log_p, batch.answer).backward()
    grads = {name: _dense(p.grad).clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    return log_p.detach(), grads


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_bf16_step_matches_fp32(kind: str, path: str) -> None:
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=1)
    results = {}
    for precision in ("fp32", "bf16"):
        model = _model(kind, path, precision)
        log_p, grads = _forward_backward(model, batch)
        assert log_p.dtype == torch.float32                              # the answer distribution
        assert all(g.dtype == torch.float32 for g in grads.values())
        optimizer = build_optimizer(model, lr=1e-3, embed_l2=1e-4)
        before = [p.detach().clone() for p in model.parameters()]
        loss = train_step(model, optimizer, batch)                        # the real step
        assert loss == loss and loss > 0                                  # finite, not NaN
        for p, old in zip(model.parameters(), before):
            assert p.dtype == torch.float32 and torch.isfinite(p).all()
            assert not torch.equal(p, old)                                # every parameter moved
        for state in optimizer.adam.state.values():
            assert all(t.dtype == torch.float32 for t in state.values() if torch.is_tensor(t))
        results[precision] = (log_p, grads)
    (lp32, g32), (lp16, g16) = results["fp32"], results["bf16"]
    finite = torch.isfinite(lp32)
    assert torch.equal(finite, torch.isfinite(lp16))                     # same absent candidates
    assert not torch.equal(lp16, lp32)                                   # bf16 really ran
    assert (lp16 - lp32)[finite].abs().max().item() < LOG_P_ATOL
    for name, grad in g32.items():
        rel = ((g16[name] - grad).norm() / grad.norm().clamp_min(1e-12)).item()
        assert rel < GRAD_RTOL, (name, rel)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_callers_autocast_does_not_change_the_readers_arithmetic(path: str) -> None:
    """Precision is an argument: an fp32 reader under the caller's bf16 autocast computes
    exactly what it computes without it, and a bf16 reader the same either way."""
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=1)
    for precision in ("fp32", "bf16"):
        model = _model("iaa", path, precision)
        plain = _forward_backward(model, batch)
        wrapped = _forward_backward(model, batch, autocast=True)
        assert torch.equal(plain[0], wrapped[0])
        assert all(torch.equal(plain[1][name], wrapped[1][name]) for name in plain[1])


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_bf16_inference_matches_fp32(kind: str, path: str) -> None:
    """Validation runs in the training precision, in inference mode: on the fast path the
    document encoder then reads its per-word projection table (bf16 here)."""
    batch = random_batch([9, 14, 5, 11], [4, 6, 3, 5], seed=2)
    model16 = _model(kind, path, "bf16").eval()
    model = _model(kind, path).eval()
    with torch.inference_mode():
        lp16 = model16(batch).log_probs                                 # builds the table
        lp32 = model(batch).log_probs
    assert lp16.dtype == lp32.dtype == torch.float32
    finite = torch.isfinite(lp32)
    assert torch.equal(finite, torch.isfinite(lp16))
    assert (lp16 - lp32)[finite].abs().max().item() < LOG_P_ATOL
