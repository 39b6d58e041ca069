"""The C++ recurrence's x86 fast paths against the Python loop of ``fused_gru``.

- AVX-512 (hidden size h % 16 == 0): the fused step (Sleef's exp and tanh, as ATen's kernels)
  computes what the Python loop computes, forward and backward, to fp32 rounding.
- AMX (h % 32 == 0, precision bf16): the recurrent matmuls multiply bf16-rounded operands with
  fp32 sums. ``amx_matmul`` equals the product of the rounded operands; the encoder under bf16
  differs from fp32 by more than fp32 rounding (the bf16 kernel ran) and stays within bf16 bounds.
- Inference from the per-word table, read in place, equals the per-token encoder.

Each test skips, saying why, on a machine without the instruction set it checks.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from iaa.model.kernels import gru_kernels
from iaa.model.kernels.encoder_table import bigru_from_table, input_table
from iaa.model.kernels.fused_gru import fused_bigru
from tests._model_inputs import one_thread  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.timeout(120)

REL = 2e-2          # bf16 bound, as tests/test_precision_auto.py
RAN_BF16 = 1e-4     # fp32 arithmetic differs by ~1e-7


def _kernels(h: int, amx: bool = False):
    kernels = gru_kernels.load()
    if kernels is None:
        pytest.skip("C++ kernels unavailable (no compiler/ninja, or IAA_NO_COMPILED_KERNELS=1)")
    if not kernels.fast_paths(h):
        pytest.skip("this CPU has no AVX-512: the fast path does not run here")
    if amx and not kernels.amx_paths(h):
        pytest.skip("this CPU has no AMX (or the OS does not grant it): the bf16 matmuls do not run here")
    return kernels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _encode(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor, weight: torch.Tensor, cpp: bool,
            bf16: bool = False):
    y = fused_bigru(x, lengths, gru._flat_weights, bf16=bf16, cpp=gru_kernels.load() if cpp else None)
    return y, torch.autograd.grad((y * weight).sum(), [x, *gru.parameters()])


def _inputs(h: int, seed: int = 0):
    torch.manual_seed(seed)
    gru = nn.GRU(48, h, batch_first=True, bidirectional=True)
    lengths = torch.tensor([37, 12, 37, 30, 1, 25, 19])                 # 7 rows: partial tiles
    x = torch.randn(7, 37, 48, requires_grad=True)
    return gru, x, lengths, torch.randn(7, 37, 2 * h)


@pytest.mark.parametrize("h", [16, 32])
def test_avx512_step_equals_the_python_loop_forward_and_backward(h: int) -> None:
    _kernels(h)
    gru, x, lengths, weight = _inputs(h)
    y_cpp, g_cpp = _encode(gru, x, lengths, weight, cpp=True)
    y_py, g_py = _encode(gru, x, lengths, weight, cpp=False)
    torch.testing.assert_close(y_cpp, y_py, atol=2e-6, rtol=1e-5)
    for a, b in zip(g_cpp, g_py):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("rows, k, n", [(29, 128, 384), (17, 384, 128), (64, 32, 32)])
def test_amx_matmul_multiplies_the_bf16_rounded_operands(rows: int, k: int, n: int) -> None:
    kernels = _kernels(k, amx=True)
    torch.manual_seed(3)
    a, b = torch.randn(rows, k), torch.randn(k, n)
    product = kernels.amx_matmul(a, b)
    assert product.shape == (rows, n) and product.dtype == torch.float32
    torch.testing.assert_close(product, a.bfloat16().float() @ b.bfloat16().float(), atol=1e-4, rtol=1e-5)
    assert _rel(product, a @ b) > RAN_BF16                                      # rounded: bf16 ran


def test_amx_recurrence_under_bf16_stays_within_bounds_and_really_ran() -> None:
    _kernels(32, amx=True)
    gru, x, lengths, weight = _inputs(32, seed=1)
    y_amx, g_amx = _encode(gru, x, lengths, weight, cpp=True, bf16=True)
    y_loop, g_loop = _encode(gru, x, lengths, weight, cpp=False, bf16=True)   # fp32 recurrence
    y32, g32 = _encode(gru, x, lengths, weight, cpp=True)
    assert torch.all(y_amx[torch.arange(37) >= lengths.unsqueeze(1)] == 0)    # padding exactly 0
    assert _rel(y_amx, y_loop) > RAN_BF16                                       # AMX matmuls ran
    for a, b in zip((y_amx, *g_amx), (y32, *g32)):
        assert _rel(a, b) < REL


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, REL)])
def test_inference_reads_the_table_in_place(dtype: torch.dtype, tolerance: float) -> None:
    cpp = _kernels(32)
    torch.manual_seed(4)
    gru = nn.GRU(48, 32, batch_first=True, bidirectional=True)
    embedding = torch.randn(90, 48)
    lengths = torch.tensor([21, 9, 21, 14, 2])
    tokens = torch.randint(0, 90, (5, 21))
    with torch.no_grad():
        expected = fused_bigru(embedding[tokens], lengths, gru._flat_weights)
        table = input_table(embedding, gru._flat_weights, dtype)
        assert table.shape == (2, 90, 96) and table.dtype == dtype
        y = bigru_from_table(tokens, lengths, table, gru._flat_weights, cpp=cpp)
    assert y.dtype == torch.float32
    assert torch.all(y[torch.arange(21) >= lengths.unsqueeze(1)] == 0)
    assert _rel(y, expected) < tolerance
