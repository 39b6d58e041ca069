"""The IAA reader's T inference steps in C++ (``iaa.model.inference_steps``) against the Python
steps of ``IAAReader._read``.

- fp32: the same log-probabilities to fp32 rounding, padded queries and documents included.
- bf16 (AMX): within bf16 bounds of fp32, and further from it than fp32 rounding (the bf16
  products ran); the packed weights follow a fused Adam step, which changes the weights in place
  without bumping their version.
- The Python steps still serve training, gradients and the fixed-query ablation.

Each test skips, saying why, where the C++ kernels or the instruction set do not run.
"""

from __future__ import annotations

import pytest
import torch

from iaa.model import build_reader, gru_kernels, inference_steps, nll_loss, precision, preset
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)

RAN_BF16 = 1e-4      # fp32 arithmetic differs by ~1e-6


def _reader(kind: str = "iaa", seed: int = 0, **overrides):
    kernels = gru_kernels.load()
    if kernels is None:
        pytest.skip("C++ kernels unavailable (no compiler/ninja, or IAA_GRU_CPP=0)")
    torch.manual_seed(seed)
    cfg = preset("demo", vocab_size=60, kind=kind, dropout=0.0, **overrides)
    if not kernels.steps_paths(2 * cfg.hidden_dim, cfg.state_dim, cfg.gate_dim):
        pytest.skip("this CPU has no AVX-512: the C++ steps do not run here")
    model = build_reader(cfg)
    with torch.no_grad():                       # attention far from uniform
        for param in model.parameters():
            param.mul_(2.0)
    return model.eval(), kernels


def _infer(model, batch, fused: bool, bf16: bool = False) -> torch.Tensor:
    usable = inference_steps.usable
    calls = []
    def spy(*args):
        calls.append(fused and usable(*args))
        return calls[-1]
    inference_steps.usable = spy
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            log_p = model(batch)
    finally:
        inference_steps.usable = usable
    assert calls == [fused]                                                    # the path asked for ran
    return log_p


BATCH = dict(doc_lens=[30, 45, 12, 38, 45], query_lens=[5, 7, 3, 6, 2], vocab=60, seed=4)


def test_fp32_steps_equal_the_python_steps() -> None:
    model, _ = _reader()
    batch = random_batch(**BATCH)
    fused, python = _infer(model, batch, True), _infer(model, batch, False)
    finite = torch.isfinite(python)
    assert torch.equal(finite, torch.isfinite(fused)) and not finite.all()     # absent candidates: -inf
    assert (fused - python)[finite].abs().max().item() < 1e-5


def test_bf16_steps_stay_within_bounds_and_multiply_in_bf16() -> None:
    model, kernels = _reader()
    if not kernels.steps_amx(2 * model.cfg.hidden_dim, model.cfg.state_dim, model.cfg.gate_dim):
        pytest.skip("this CPU has no AMX (or the OS does not grant it): the bf16 products do not run here")
    batch = random_batch(**BATCH)
    fp32 = _infer(model, batch, False)
    fused, python = _infer(model, batch, True, bf16=True), _infer(model, batch, False, bf16=True)
    finite = torch.isfinite(fp32)
    assert torch.equal(finite, torch.isfinite(fused))
    assert RAN_BF16 < (fused - fp32)[finite].abs().max().item() < 0.01
    assert (fused - python)[finite].abs().max().item() < 0.01
    precision.BF16_SMALL_MATMULS = False                   # bf16 reads, fp32 products under autocast
    try:
        reads_only = _infer(model, batch, True, bf16=True)
    finally:
        precision.BF16_SMALL_MATMULS = True
    assert RAN_BF16 < (reads_only - fp32)[finite].abs().max().item() < 0.01
    assert (reads_only - fused)[finite].abs().max().item() > RAN_BF16         # the products differ


def test_packed_weights_follow_a_fused_adam_step() -> None:
    """A training step between two bf16 inference passes: the second pass packs the weights
    again (fused Adam changes them in place without bumping their version)."""
    model, kernels = _reader()
    if not kernels.steps_amx(2 * model.cfg.hidden_dim, model.cfg.state_dim, model.cfg.gate_dim):
        pytest.skip("this CPU has no AMX (or the OS does not grant it): nothing is packed here")
    batch = random_batch(**BATCH)
    before = _infer(model, batch, True, bf16=True)
    version = model.search.weight_hh._version
    model.train()
    nll_loss(model(batch), batch.answer).backward()
    rest = [p for p in model.parameters() if p is not model.embedding.weight]
    torch.optim.Adam(rest, lr=0.05, fused=True).step()
    assert model.search.weight_hh._version == version
    model.eval()
    after = _infer(model, batch, True, bf16=True)
    model._step_weights.reset()
    fresh, fp32 = _infer(model, batch, True, bf16=True), _infer(model, batch, False)
    finite = torch.isfinite(fp32)
    assert torch.equal(after, fresh)                                           # not the stale packing
    assert (after - fp32)[finite].abs().max().item() < 0.02
    assert (after - before)[finite].abs().max().item() > 0.05


@pytest.mark.parametrize("case", ["training", "gradient", "fixed-query"])
def test_the_python_steps_serve_training_gradients_and_the_ablation(case) -> None:
    model, _ = _reader(kind="iaa-fixed-query" if case == "fixed-query" else "iaa")
    q_enc = torch.zeros(2, 3, 2 * model.cfg.hidden_dim)
    if case == "training":
        model.train()
    with torch.set_grad_enabled(case == "gradient"):
        assert not inference_steps.usable(model, q_enc)
    model.eval()
    if case != "fixed-query":
        with torch.no_grad():
            assert inference_steps.usable(model, q_enc)
