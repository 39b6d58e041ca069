"""The IAA reader's T attention steps for inference, as one C++ call per batch (CPU).

In inference the steps are most of the reader's time once the encoders read the per-word table:
at batch 32 and T = 8 each step is seven 32-row matmuls and four reads of the encodings, about
150 operator calls a step from Python, each costing more in dispatch than in arithmetic. The
reads are memory-bound: each read of the document's encodings (B, Ld, 2h) streams them from
memory once, 2T - 1 times a batch.

``gru_kernels.iaa_steps`` runs the same steps (``IAAReader._read``, without dropout) in C++:

- each read fuses the logits, their masked softmax and the glimpse per example, so the glimpse
  re-reads that example's encodings from cache rather than from memory;
- the keys and the glimpse are fp32 and each dot product sums in fp32, whatever the encodings'
  dtype (under bf16 the encodings are bf16, cast once per batch as ``attention.Memory`` does);
- the 32-row matmuls take bf16 operands on AMX (fp32 accumulation) under bf16 where the CPU has
  AMX, with the weights packed once and kept until they change, else fp32.

``tests/test_inference_steps.py`` holds it to the Python steps. ``IAA_GRU_CPP=0`` (no C++ at all)
or ``FusedBiGRU.use_cpp = False`` keep the Python steps.
"""

from __future__ import annotations

import torch
from torch import nn

from iaa.model import gru_kernels
from iaa.model.attention import QueryRead
from iaa.model.fused_gru import FusedBiGRU


def _layers(reader: nn.Module) -> list[nn.Module]:
    return [reader.query_read.proj, reader.doc_read.proj, reader.gate_q.hidden, reader.gate_q.out,
            reader.gate_d.hidden, reader.gate_d.out]


def _weights(reader: nn.Module) -> list[torch.Tensor]:
    """The 16 tensors ``iaa_steps`` reads, in its order (fp32 views of the parameters)."""
    cell = reader.search
    flat = [t for layer in _layers(reader) for t in (layer.weight, layer.bias)]
    return [t.detach() for t in (*flat, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)]


class StepWeights:
    """The steps' weights, and their AMX-packed bf16 copies while the weights stay the same.

    Packing is a pass over ~2.7 M numbers at the paper config; it is redone when a weight's
    storage or version changes, and after any training forward pass (``reset``): an optimiser
    may update the weights in place without bumping their version (fused Adam does not).
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._packed: list[torch.Tensor] = []

    def reset(self) -> None:
        self._key, self._packed = None, []

    def get(self, reader: nn.Module, amx: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        weights = _weights(reader)
        if not amx:
            return weights, []
        key = tuple((t.data_ptr(), t._version) for t in weights)
        if key != self._key:
            kernels = gru_kernels.load()
            matrices = [*weights[0:12:2], weights[12], weights[13]]
            self._packed, self._key = [kernels.pack_linear(w.float()) for w in matrices], key
        return weights, self._packed


def usable(reader: nn.Module, q_enc: torch.Tensor) -> bool:
    """Whether ``logits`` serves this forward pass: inference (eval mode, no gradient) of the IAA
    reader with learned query attention, on the CPU, where the C++ kernels and AVX-512 run."""
    if (reader.training or torch.is_grad_enabled() or not q_enc.is_cpu or not FusedBiGRU.use_cpp
            or not isinstance(reader.query_read, QueryRead) or torch.compiler.is_compiling()):
        return False
    kernels = gru_kernels.load()
    cfg = reader.cfg
    return kernels is not None and kernels.steps_paths(2 * cfg.hidden_dim, cfg.state_dim, cfg.gate_dim)


def logits(reader: nn.Module, cache: StepWeights, q_enc: torch.Tensor, d_enc: torch.Tensor,
           query_mask: torch.Tensor, doc_mask: torch.Tensor, bf16: bool, bf16_matmuls: bool) -> torch.Tensor:
    """The last step's document logits d̃_iᵀ(A_d [s_{T-1}, q_T] + a_d): (B, Ld), fp32.

    ``bf16``: the reads take the encodings in bf16; ``bf16_matmuls``: the 32-row matmuls take
    bf16 operands, on AMX only (elsewhere they stay fp32).
    """
    kernels = gru_kernels.load()
    cfg = reader.cfg
    amx = bf16_matmuls and kernels.steps_amx(2 * cfg.hidden_dim, cfg.state_dim, cfg.gate_dim)
    weights, packed = cache.get(reader, amx)
    memory = d_enc.to(torch.bfloat16) if bf16 else d_enc.float()
    with torch.autocast("cpu", enabled=False):                          # fp32 products stay fp32
        return kernels.iaa_steps(q_enc.float(), query_mask, memory, doc_mask, weights, packed, cfg.steps)
