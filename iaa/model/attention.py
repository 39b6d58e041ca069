"""Attentive reads over query and document encodings (paper section 3, "Iterative Alternating
Attention"), and the AS Reader's dot-product read."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from iaa.model.deferred import DeferredGrad
from iaa.model.masking import masked_softmax
from iaa.model.precision import compute_dtype, linear


class Memory:
    """Encodings M (B, L, k) read many times, with one gradient GEMM for all the reads.

    Each read of M, logits M v or a glimpse wᵀM, adds a rank-1 term to dL/dM. Left to autograd,
    each of the 2T - 1 document reads writes a full (B, L, k) gradient and adds it to a running
    sum: ~6 passes over M per read. Here each read's backward only records its two factors and
    returns no gradient for M; when every read is done, dL/dM = U Vᵀ in one batched GEMM with
    inner size 2T - 1. Same gradient, one pass. ``deferred=False`` uses plain autograd (reference).

    The reads multiply in ``dtype``: by default autocast's where it is on when the memory is
    made (bf16 under ``train.precision=bf16``), whether or not it is still on at the reads. M is
    cast once here (not once per read), each read casts its other factor, and returns its result
    in M's own dtype (fp32), so the softmaxes and gates around the reads stay fp32. The gradient
    reaches the fp32 M through the cast.

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
        memory = memory.to(dtype or compute_dtype(memory))                  # cast once, not per read
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
            logits = bilinear_logits(self.tensor, key.to(self.tensor.dtype))
        return logits[:, :self.length].to(self.dtype)

    def glimpse(self, weights: torch.Tensor) -> torch.Tensor:
        """Σ_i w_i m_i: (B, k)."""
        pad = self.tensor.shape[1] - self.length
        weights = F.pad(weights, (0, pad)) if pad else weights
        if self.deferred:
            return _Read.apply(self.tensor, weights, self, False).to(self.dtype)
        return glimpse(weights.to(self.tensor.dtype), self.tensor).to(self.dtype)



class _Read(torch.autograd.Function):
    """One read of M that defers dL/dM to ``DeferredGrad``: logits M x, or glimpse xᵀM.

    The two reads are each other's transpose, so each one's backward for x is the other read,
    and each records its rank-1 factors (left (B, L), right (B, k)) for dL/dM.
    """

    @staticmethod
    def forward(ctx, memory: torch.Tensor, x: torch.Tensor, reads: Memory, logits: bool) -> torch.Tensor:
        x = x.to(memory.dtype)                 # under autocast: M is already in its dtype
        ctx.save_for_backward(memory, x)
        ctx.reads, ctx.logits = reads, logits
        return bilinear_logits(memory, x) if logits else glimpse(x, memory)  # (B, L) or (B, k)

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        memory, x = ctx.saved_tensors
        d_out = d_out.to(memory.dtype)
        left, right = (d_out, x) if ctx.logits else (x, d_out)
        ctx.reads.left.append(left)
        ctx.reads.right.append(right)
        d_x = glimpse(d_out, memory) if ctx.logits else bilinear_logits(memory, d_out)
        return None, d_x, None, None


def glimpse(weights: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """Σ_i w_i m_i. weights: (B, L), memory: (B, L, k) -> (B, k)."""
    return torch.bmm(weights.unsqueeze(1), memory).squeeze(1)


def bilinear_logits(memory: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """m_iᵀ key. memory: (B, L, k), key: (B, k) -> (B, L)."""
    return torch.bmm(memory, key.unsqueeze(2)).squeeze(2)


class QueryRead(nn.Module):
    """q_{i,t} = softmax_i q̃_iᵀ(A_q s_{t-1} + a_q);  q_t = Σ_i q_{i,t} q̃_i.

    Args:
        state_dim: s. enc_dim: 2h.
    """

    def __init__(self, state_dim: int, enc_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(state_dim, enc_dim)                 # A_q (2h x s), a_q

    def forward(self, s: torch.Tensor, q_enc: torch.Tensor, q_mask: torch.Tensor):
        """s: (B, s), q_enc: (B, Lq, 2h), q_mask: (B, Lq). Returns q_t (B, 2h), q_att (B, Lq)."""
        att = masked_softmax(bilinear_logits(q_enc, linear(s, self.proj)), q_mask)  # (B, Lq)
        return glimpse(att, q_enc), att


class FixedQueryRead(nn.Module):
    """The ablation "fixed query attention": q_{i,t} = 1/|Q| over real query tokens."""

    def forward(self, s: torch.Tensor, q_enc: torch.Tensor, q_mask: torch.Tensor):
        """Same contract as ``QueryRead``; ``s`` is ignored."""
        att = q_mask.to(q_enc.dtype) / q_mask.sum(1, keepdim=True)          # (B, Lq)
        return glimpse(att, q_enc), att


class DocRead(nn.Module):
    """d_{i,t} = softmax_i d̃_iᵀ(A_d [s_{t-1}, q_t] + a_d);  d_t = Σ_i d_{i,t} d̃_i.

    Args:
        state_dim: s. enc_dim: 2h.
    """

    def __init__(self, state_dim: int, enc_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(state_dim + enc_dim, enc_dim)       # A_d (2h x (s + 2h)), a_d

    def logits(self, s: torch.Tensor, q_t: torch.Tensor, d_enc: Memory) -> torch.Tensor:
        """Unnormalised scores d̃_iᵀ(A_d [s, q_t] + a_d): (B, Ld)."""
        return d_enc.logits(linear(torch.cat([s, q_t], -1), self.proj))

    def forward(self, s: torch.Tensor, q_t: torch.Tensor, d_enc: Memory, d_mask: torch.Tensor):
        """s: (B, s), q_t: (B, 2h), d_enc: d̃ (B, Ld, 2h). Returns d_t (B, 2h), logits (B, Ld)."""
        logits = self.logits(s, q_t, d_enc)                                  # (B, Ld)
        return d_enc.glimpse(masked_softmax(logits, d_mask)), logits
