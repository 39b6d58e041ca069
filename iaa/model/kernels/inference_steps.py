"""The IAA reader's T attention steps for inference, as one C++ call per batch (CPU).

In inference the steps are most of the reader's time once the encoders read the per-word table:
at batch 32 and T = 8 each step is seven 32-row matmuls and four reads of the encodings, about
150 operator calls a step from Python, each costing more in dispatch than in arithmetic. The
reads are memory-bound: each read of the document's encodings (B, Ld, 2h) streams them from
memory once, 2T - 1 times a batch.

``gru_kernels.iaa_steps`` runs the same steps (the fixed-T steps of ``IAAReader``, without
dropout) in C++:

- each read fuses the logits, their masked softmax and the glimpse per example, so the glimpse
  re-reads that example's encodings from cache rather than from memory;
- the keys and the glimpse are fp32 and each dot product sums in fp32, whatever the encodings'
  dtype (under bf16 the encodings are bf16, cast once per batch as ``deferred.Memory`` does);
- the 32-row matmuls take bf16 operands on AMX (fp32 accumulation) under bf16 where the CPU has
  AMX, with the weights packed once and kept until they change, else fp32.

It computes the paper's reader only: learned query attention, a fixed number of steps
(``Support`` below); the fixed-query ablation and ACT run the Python steps.
"""

from __future__ import annotations

from types import ModuleType
from typing import Sequence

import torch
from torch import nn

from iaa.model.kernels import gru_kernels
from iaa.model.kernels.support import Support
from iaa.model.kernels.kernel_internals import version


class FusedSteps:
    """The T steps of an IAA reader's inference in one C++ call; the last document logits.

    ``bf16_products=False`` keeps the 32-row products fp32 under bf16 (the reads stay bf16).
    ``generic=True`` runs the C++ kernels' generic build of the steps (plain loops for the reads
    and the gate arithmetic, any CPU and sizes): never chosen by ``select``, it holds the C++ step
    loop to the reference on CPUs without AVX-512.
    The AMX-packed weights are kept while the weights stay the same: packing is a pass over
    ~2.7 M numbers at the paper config, redone when a weight's storage or version changes, and
    after ``forget`` (each training pass: an optimiser may update the weights in place without
    bumping their version; fused Adam does not).
    """

    slot, switch = "steps", None
    support = Support(devices=frozenset({"cpu"}),
                      equations={"kind": frozenset({"iaa"}), "halting": frozenset({"none"}),
                                 "candidate_softmax": frozenset({False, True})})

    def __init__(self, cpp: ModuleType, precision: str = "fp32", bf16_products: bool = True,
                 generic: bool = False) -> None:
        self.cpp, self.bf16 = cpp, precision == "bf16"
        self.bf16_products, self.generic = bf16_products, generic
        self._key: tuple | None = None
        self._packed: list[torch.Tensor] = []

    @classmethod
    def make(cls, cfg, precision: str) -> "FusedSteps | None":
        cpp = gru_kernels.load()
        if cpp is None or not cpp.steps_paths(2 * cfg.hidden_dim, cfg.state_dim, cfg.gate_dim):
            return None                                                    # no AVX-512, or sizes
        return cls(cpp, precision)

    def forget(self) -> None:
        self._key, self._packed = None, []

    def _packed_weights(self, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple((t.data_ptr(), version(t)) for t in weights)
        if key != self._key:
            matrices = [*weights[0:12:2], weights[12], weights[13]]
            self._packed, self._key = [self.cpp.pack_linear(w.float()) for w in matrices], key
        return self._packed

    def last_logits(self, layers: Sequence[nn.Linear], cell: nn.GRUCell, q_enc: torch.Tensor, d_enc: torch.Tensor,
                    query_mask: torch.Tensor, doc_mask: torch.Tensor, steps: int) -> torch.Tensor:
        """The last step's document logits d̃_iᵀ(A_d [s_{T-1}, q_T] + a_d): (B, Ld), fp32.

        Args:
            layers: A_q, A_d, then the two layers of g_q and of g_d (``nn.Linear``).
            cell: the inference GRU.
            q_enc: (B, Lq, 2h). d_enc: (B, Ld, 2h). query_mask, doc_mask: bool. steps: T.
        """
        flat = [t for layer in layers for t in (layer.weight, layer.bias)]
        weights = [t.detach() for t in (*flat, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)]
        hidden, state, gate = q_enc.shape[2], cell.hidden_size, layers[2].out_features
        amx = self.bf16 and self.bf16_products and self.cpp.steps_amx(hidden, state, gate)
        packed = self._packed_weights(weights) if amx else []
        memory = d_enc.to(torch.bfloat16) if self.bf16 else d_enc.float()
        with torch.autocast("cpu", enabled=False):                          # fp32 products stay fp32
            return self.cpp.iaa_steps(q_enc.float(), query_mask, memory, doc_mask, weights, packed, steps,
                                      self.generic)
