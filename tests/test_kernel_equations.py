"""The equations that the kernels write again, held to the reference on every CPU.

- ``precision.Layers.gru_cell`` writes the inference GRU's gates in Python (for its bf16 weight
  copies and AMX products): on operands that bf16 holds exactly, with sums bf16 holds exactly,
  it equals ``nn.GRUCell`` to fp32 rounding, wherever it runs.
- ``inference_steps.FusedSteps`` writes the IAA steps in C++. Its AVX-512 build runs where the CPU
  has AVX-512; its generic build (the same step loop, with plain loops for the reads and the gate
  arithmetic) runs on every CPU the C++ kernels build on, so the steps' equations are checked on
  any machine, not only on one with AVX-512.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from iaa.model import build_reader, preset
from iaa.model import kernels as fast
from iaa.model.kernels import gru_kernels
from iaa.model.kernels.inference_steps import FusedSteps
from iaa.model.kernels.precision import Layers
from iaa.model.reader import Masks
from tests._model_inputs import one_thread, random_batch  # noqa: F401 (autouse fixture)


def _exact(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """Multiples of 1/8 in [-1/2, 1/2]: exact in bf16, and so are the short sums of their products."""
    return torch.randint(-4, 5, shape, generator=generator).float() / 8


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_the_bf16_layers_gru_cell_is_the_reference_cell(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    cell = nn.GRUCell(6, 8)
    with torch.no_grad():
        for param in cell.parameters():
            param.copy_(_exact(*param.shape, generator=g))
    x, h = _exact(rows, 6, generator=g), _exact(rows, 8, generator=g)
    with torch.no_grad():
        got = Layers(bf16_copies=True).gru_cell(x, h, cell)                     # bf16 weights, fp32 gates
        want = cell(x, h)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    swapped = cell.weight_ih.detach().clone()                                  # r and z swapped: caught
    swapped[:8], swapped[8:16] = cell.weight_ih[8:16].detach(), cell.weight_ih[:8].detach()
    with torch.no_grad():
        cell.weight_ih.copy_(swapped)
        assert (Layers(bf16_copies=True).gru_cell(x, h, cell) - want).abs().max() > 1e-3


def _cpp():
    cpp = gru_kernels.load()
    if cpp is None:
        pytest.skip("the C++ kernels do not build here (no compiler/ninja, or IAA_NO_COMPILED_KERNELS=1)")
    return cpp


@pytest.mark.parametrize("build", ["avx512", "generic"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("sizes", [dict(hidden_dim=16, state_dim=32, gate_dim=16),
                                   dict(hidden_dim=8, state_dim=12, gate_dim=10)])
def test_the_fused_steps_equal_the_reference_steps(build: str, precision: str, sizes: dict) -> None:
    cpp = _cpp()
    generic = build == "generic"
    if not generic and not cpp.steps_paths(2 * sizes["hidden_dim"], sizes["state_dim"], sizes["gate_dim"]):
        pytest.skip("the AVX-512 steps do not run here (no AVX-512, or sizes not multiples of 16): "
                    "the generic build is checked instead")
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=60, steps=4, **sizes)
    model = build_reader(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(2.0)                                                    # attention far from uniform
    batch = random_batch([30, 45, 12, 38, 45], [5, 7, 3, 6, 2], vocab=60, seed=4)
    two_h = 2 * cfg.hidden_dim
    q_enc = torch.randn(5, batch.query.shape[1], two_h) * batch.query_mask.unsqueeze(2)
    d_enc = torch.randn(5, batch.doc.shape[1], two_h) * batch.doc_mask.unsqueeze(2)
    masks = Masks(batch.query_mask, batch.doc_mask, batch.doc_mask)
    steps = FusedSteps(cpp, precision, bf16_products=False, generic=generic)
    layers = [model.query_read.proj, model.doc_read.proj, model.gate_q.hidden, model.gate_q.out,
              model.gate_d.hidden, model.gate_d.out]
    model.kernels = fast.Kernels("cpu", "fp32")                                # the reference steps
    with torch.no_grad():
        fused = steps.last_logits(layers, model.search, q_enc, d_enc, masks.query, masks.doc, cfg.steps)
        reference, _ = model._steps(q_enc, d_enc, masks, trace=False)
        if precision == "bf16":                                                # the reads take bf16 encodings
            reference_bf16, _ = model._steps(q_enc, d_enc.bfloat16().float(), masks, trace=False)
    real = masks.doc
    tol = 1e-4 if precision == "fp32" else 1e-3
    want = reference if precision == "fp32" else reference_bf16
    assert (fused - want)[real].abs().max().item() < tol
    assert (fused - reference)[real].abs().max().item() < 0.05
