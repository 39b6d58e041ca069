"""The IAA reader's T inference steps in C++ (``iaa.model.kernels.inference_steps``) against the
Python steps of the reference reader.

- fp32: the same log-probabilities to fp32 rounding, padded queries and documents included.
- bf16 (AMX): within bf16 bounds of fp32, and further from it than fp32 rounding (the bf16
  products ran); the packed weights follow a fused Adam step, which changes the weights in place
  without bumping their version.
- The Python steps still serve training, gradients, traces, the fixed-query ablation and ACT.

Each test skips, saying why, where the C++ kernels or the instruction set do not run.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from iaa.model import build_reader, nll_loss, preset
from iaa.model.kernels import gru_kernels
from iaa.model.kernels.inference_steps import FusedSteps
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)

RAN_BF16 = 1e-4      # fp32 arithmetic differs by ~1e-6


def _reader(kind: str = "iaa", seed: int = 0, precision: str = "fp32", **overrides):
    kernels = gru_kernels.load()
    if kernels is None:
        pytest.skip("C++ kernels unavailable (no compiler/ninja, or IAA_NO_COMPILED_KERNELS=1)")
    torch.manual_seed(seed)
    cfg = preset("demo", vocab_size=60, kind=kind, dropout=0.0, **overrides)
    if not kernels.steps_paths(2 * cfg.hidden_dim, cfg.state_dim, cfg.gate_dim):
        pytest.skip("this CPU has no AVX-512: the C++ steps do not run here")
    model = build_reader(cfg, precision=precision)
    with torch.no_grad():                       # attention far from uniform
        for param in model.parameters():
            param.mul_(2.0)
    return model.eval(), kernels


def _infer(model, batch, fused: bool, monkeypatch) -> torch.Tensor:
    """log P in inference, with the C++ steps (``fused``) or with the Python steps."""
    calls = []
    last_logits = FusedSteps.last_logits

    def spy(self, *args):
        calls.append(1)
        return last_logits(self, *args)

    monkeypatch.setattr(FusedSteps, "last_logits", spy)
    kernels = model.kernels
    if not fused:
        model.kernels = dataclasses.replace(kernels, steps=None)
    try:
        with torch.inference_mode():
            log_p = model(batch).log_probs
    finally:
        model.kernels = kernels
        monkeypatch.setattr(FusedSteps, "last_logits", last_logits)
    assert len(calls) == int(fused)                                            # the path asked for ran
    return log_p


BATCH = dict(doc_lens=[30, 45, 12, 38, 45], query_lens=[5, 7, 3, 6, 2], vocab=60, seed=4)


def test_fp32_steps_equal_the_python_steps(monkeypatch) -> None:
    model, _ = _reader()
    assert isinstance(model.kernels.steps, FusedSteps)                         # select chose them
    batch = random_batch(**BATCH)
    fused, python = _infer(model, batch, True, monkeypatch), _infer(model, batch, False, monkeypatch)
    finite = torch.isfinite(python)
    assert torch.equal(finite, torch.isfinite(fused)) and not finite.all()     # absent candidates: -inf
    assert (fused - python)[finite].abs().max().item() < 1e-5


def test_bf16_steps_stay_within_bounds_and_multiply_in_bf16(monkeypatch) -> None:
    model, kernels = _reader(precision="bf16")
    if not kernels.steps_amx(2 * model.cfg.hidden_dim, model.cfg.state_dim, model.cfg.gate_dim):
        pytest.skip("this CPU has no AMX (or the OS does not grant it): the bf16 products do not run here")
    fp32_model, _ = _reader()
    batch = random_batch(**BATCH)
    fp32 = _infer(fp32_model, batch, False, monkeypatch)
    fused, python = _infer(model, batch, True, monkeypatch), _infer(model, batch, False, monkeypatch)
    finite = torch.isfinite(fp32)
    assert torch.equal(finite, torch.isfinite(fused))
    assert RAN_BF16 < (fused - fp32)[finite].abs().max().item() < 0.01
    assert (fused - python)[finite].abs().max().item() < 0.01
    model.kernels.steps.bf16_products = False              # bf16 reads, fp32 products
    reads_only = _infer(model, batch, True, monkeypatch)
    assert RAN_BF16 < (reads_only - fp32)[finite].abs().max().item() < 0.01
    assert (reads_only - fused)[finite].abs().max().item() > RAN_BF16         # the products differ


def test_packed_weights_follow_a_fused_adam_step(monkeypatch) -> None:
    """A training step between two bf16 inference passes: the second pass packs the weights
    again (fused Adam changes them in place without bumping their version)."""
    model, kernels = _reader(precision="bf16")
    if not kernels.steps_amx(2 * model.cfg.hidden_dim, model.cfg.state_dim, model.cfg.gate_dim):
        pytest.skip("this CPU has no AMX (or the OS does not grant it): nothing is packed here")
    fp32_model, _ = _reader()
    batch = random_batch(**BATCH)
    before = _infer(model, batch, True, monkeypatch)
    version = model.search.weight_hh._version
    model.train()
    nll_loss(model(batch).log_probs, batch.answer).backward()
    rest = [p for p in model.parameters() if p is not model.embedding.weight]
    torch.optim.Adam(rest, lr=0.05, fused=True).step()
    assert model.search.weight_hh._version == version
    model.eval()
    fp32_model.load_state_dict(model.state_dict())
    after = _infer(model, batch, True, monkeypatch)
    model.kernels.steps.forget()
    fresh, fp32 = _infer(model, batch, True, monkeypatch), _infer(fp32_model, batch, False, monkeypatch)
    finite = torch.isfinite(fp32)
    assert torch.equal(after, fresh)                                           # not the stale packing
    assert (after - fp32)[finite].abs().max().item() < 0.02
    assert (after - before)[finite].abs().max().item() > 0.05


@pytest.mark.parametrize("case", ["training", "gradient", "trace", "fixed-query", "act"])
def test_the_python_steps_serve_training_gradients_traces_the_ablation_and_act(case, monkeypatch) -> None:
    kind = "iaa-fixed-query" if case == "fixed-query" else "iaa"
    model, _ = _reader(kind=kind, halting="act" if case == "act" else "none")
    assert (model.kernels.steps is None) == (case in ("fixed-query", "act"))   # not declared: not chosen
    calls = []
    last_logits = FusedSteps.last_logits
    monkeypatch.setattr(FusedSteps, "last_logits", lambda self, *a: calls.append(1) or last_logits(self, *a))
    batch = random_batch(**BATCH)
    if case == "training":
        model.train()
    with torch.set_grad_enabled(case in ("training", "gradient")):
        model(batch, trace=case == "trace")
    assert calls == []
    model.eval()
    with torch.no_grad():
        model(batch)
    assert calls == ([] if case in ("fixed-query", "act") else [1])
