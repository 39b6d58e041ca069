"""Deferred gradients: a gradient assembled once, after every use of a tensor (the document
reads of ``Memory``, the AMX layers' weights in ``precision``). The uses record factors instead
of returning gradients, and an identity placed before them asks for the sum in one product
when autograd reaches it."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from iaa.model.kernels.support import Support


class Collector(Protocol):
    def gradient(self) -> torch.Tensor | None:
        """The sum of the recorded terms (None when nothing was recorded); forgets them."""


class DeferredGrad(torch.autograd.Function):
    """Identity on a tensor whose backward adds ``collector.gradient()`` to the gradient that
    reached it directly (if any)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, collector: Collector) -> torch.Tensor:
        ctx.collector = collector
        ctx.set_materialize_grads(False)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor | None):
        collector, ctx.collector = ctx.collector, None
        term = collector.gradient()
        if term is not None:
            grad = term if grad is None else grad + term
        return grad, None


class Memory:
    """Encodings M (B, L, k) read many times, with one gradient GEMM for all the reads.

    Each read of M, logits M v or a glimpse wᵀM, adds a rank-1 term to dL/dM. Left to autograd,
    each of the 2T - 1 document reads writes a full (B, L, k) gradient and adds it to a running
    sum: ~6 passes over M per read. Here each read's backward only records its two factors and
    returns no gradient for M; when every read is done, dL/dM = U Vᵀ in one batched GEMM with
    inner size 2T - 1. Same gradient, one pass. ``deferred=False`` uses plain autograd.

    The reads multiply in ``dtype`` (default M's): M is cast once here (not once per read), each
    read casts its other factor and returns its result in M's own dtype (fp32), so the softmaxes
    and gates around the reads stay fp32. The gradient reaches the fp32 M through the cast.

    In bf16 on the CPU, M's length L is padded with zero rows to a multiple of ``PAD_BF16`` (the
    reads see only the real L): oneDNN builds a kernel for each new shape of a bf16 batched
    matmul (~5 ms), and nearly every batch has its own L.
    """

    PAD_BF16 = 64

    def __init__(self, memory: torch.Tensor, deferred: bool = True, dtype: torch.dtype | None = None) -> None:
        self.deferred = deferred and memory.requires_grad and torch.is_grad_enabled()
        self.left: list[torch.Tensor] = []     # (B, L) factors
        self.right: list[torch.Tensor] = []    # (B, k) factors
        self.dtype = memory.dtype              # of the reads' results
        self.length = memory.shape[1]
        memory = memory.to(dtype or memory.dtype)                          # cast once, not per read
        pad = -self.length % self.PAD_BF16
        if memory.dtype == torch.bfloat16 and memory.is_cpu and pad:
            memory = F.pad(memory, (0, 0, 0, pad))
        if self.deferred:
            memory = DeferredGrad.apply(memory, self)
        self.tensor = memory                   # (B, L, k) in the reads' compute dtype

    def gradient(self) -> torch.Tensor | None:
        """dL/dM = Σ_j left_j ⊗ right_j over the reads, in one GEMM (``DeferredGrad``)."""
        terms = None
        if self.left:
            terms = torch.bmm(torch.stack(self.left, 2), torch.stack(self.right, 1))  # (B, L, k)
        self.left, self.right = [], []
        return terms

    def select(self, rows: torch.Tensor) -> "Memory":
        """The same memory for the examples ``rows`` only (inference: no deferred gradient)."""
        chosen = Memory.__new__(Memory)
        chosen.deferred, chosen.left, chosen.right = False, [], []
        chosen.dtype, chosen.length, chosen.tensor = self.dtype, self.length, self.tensor[rows]
        return chosen

    def logits(self, key: torch.Tensor) -> torch.Tensor:
        """m_iᵀ key: (B, L)."""
        if self.deferred:
            logits = _Read.apply(self.tensor, key, self, True)
        else:
            logits = _logits(self.tensor, key.to(self.tensor.dtype))
        return logits[:, :self.length].to(self.dtype)

    def glimpse(self, weights: torch.Tensor) -> torch.Tensor:
        """Σ_i w_i m_i: (B, k)."""
        pad = self.tensor.shape[1] - self.length
        weights = F.pad(weights, (0, pad)) if pad else weights
        if self.deferred:
            return _Read.apply(self.tensor, weights, self, False).to(self.dtype)
        return _glimpse(weights.to(self.tensor.dtype), self.tensor).to(self.dtype)


class _Read(torch.autograd.Function):
    """One read of M that defers dL/dM to ``DeferredGrad``: logits M x, or glimpse xᵀM.

    The two reads are each other's transpose, so each one's backward for x is the other read,
    and each records its rank-1 factors (left (B, L), right (B, k)) for dL/dM.
    """

    @staticmethod
    def forward(ctx, memory: torch.Tensor, x: torch.Tensor, reads: Memory, logits: bool) -> torch.Tensor:
        x = x.to(memory.dtype)                 # M is already in the reads' dtype
        ctx.save_for_backward(memory, x)
        ctx.reads, ctx.logits = reads, logits
        return _logits(memory, x) if logits else _glimpse(x, memory)  # (B, L) or (B, k)

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        memory, x = ctx.saved_tensors
        d_out = d_out.to(memory.dtype)
        left, right = (d_out, x) if ctx.logits else (x, d_out)
        ctx.reads.left.append(left)
        ctx.reads.right.append(right)
        d_x = _glimpse(d_out, memory) if ctx.logits else _logits(memory, d_out)
        return None, d_x, None, None


def _glimpse(weights: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    return torch.bmm(weights.unsqueeze(1), memory).squeeze(1)            # (B, L), (B, L, k) -> (B, k)


def _logits(memory: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    return torch.bmm(memory, key.unsqueeze(2)).squeeze(2)                # (B, L, k), (B, k) -> (B, L)


class DeferredReads:
    """The document reads of the attention steps through ``Memory``: one gradient GEMM for all
    the reads of a pass; in bf16, M cast to bf16 once (and padded on the CPU)."""

    slot, switch = "reads", "batched_read_grad"
    support = Support(devices=frozenset({"cpu", "cuda"}))

    def __init__(self, precision: str = "fp32") -> None:
        self.dtype = torch.bfloat16 if precision == "bf16" else None

    @classmethod
    def make(cls, cfg, precision: str) -> "DeferredReads":
        return cls(precision)

    def memory(self, encodings: torch.Tensor) -> Memory:
        """The reads of ``encodings`` (B, L, k), fp32: ``logits``, ``glimpse``, ``select``."""
        return Memory(encodings, deferred=True, dtype=self.dtype)
