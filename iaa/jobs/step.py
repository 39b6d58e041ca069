"""One training step and its optimiser: the only place the training mathematics lives.

The objective (paper, "Training Details") is

    loss = -mean log P(a* | Q, D) + embed_l2 * ||X||²       (X: the word embedding)

with the gradient clipped to norm ``clip`` (over all parameters, the L2 term included) and Adam.
The training loop, the evaluation job and the Ray adapter all call ``build_optimizer`` and
``train_step``, so every caller gets the fast path.

Fast path, same mathematics. A dense Adam update of the 50,000 x 384 embedding is needed for
exactness: with the L2 term every row has a gradient (2 λ x_r) every step, and Adam's moments
move rows that the batch did not touch. What is avoided is everything else that is dense:

- The embedding's data gradient stays sparse (``nn.Embedding(sparse=True)``): no zero-fill of a
  77 MB gradient and no dense scatter.
- The L2 gradient is never materialised. The clipping norm is computed exactly from
  ||2λX + S||² = 4λ²||X||² + Σ_{rows r of S} (||2λx_r + s_r||² - ||2λx_r||²), where S is the
  coalesced sparse data gradient; ||X||² is also the value of the L2 term.
- The clipped gradient c (S + 2λX) reaches Adam as a persistent dense buffer holding c S on the
  touched rows (only last step's rows are re-zeroed) plus Adam's own L2 term with
  weight_decay = 2λc, which the fused Adam kernel adds as grad + weight_decay * param: exactly
  the L2 gradient, after clipping, as in the reference.
- Adam is ``torch.optim.Adam(fused=True)``: one pass over each tensor instead of ~10.

``tests/test_model_fast_paths.py`` checks this against the reference (dense gradients, the L2
term in the loss, ``clip_grad_norm_``, plain Adam).
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import nullcontext

import torch
from torch import nn

from iaa.data.batch import Batch
from iaa.model.pointer import nll_loss


def retain_freed_memory() -> bool:
    """Keep freed memory in the process heap instead of returning it to the OS (glibc only).

    Why: a training step at the paper config allocates and frees ~200 MB of activations in blocks
    above glibc's mmap threshold, so each is a fresh mmap whose pages the kernel faults in and
    zeroes again: ~47,000 page faults per batch, ~13% of a step's CPU time (benchmarks/README.md).
    Cost: resident memory stays at its peak. Process-wide and idempotent; returns whether it applied.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def _unwrap(model: nn.Module) -> nn.Module:
    """The reader inside a DDP (or similar) wrapper."""
    return getattr(model, "module", model)


def build_optimizer(model: nn.Module, lr: float, embed_l2: float) -> torch.optim.Adam:
    """Adam (fused where the device allows) with the embedding in its own parameter group.

    Args:
        model: a reader from ``iaa.model.build_reader`` (or a wrapper with ``.module``).
        lr: learning rate for both groups (the loop may scale ``param_groups[i]["lr"]``).
        embed_l2: λ of the embedding L2 term; recorded in the embedding group. ``train_step``
            sets that group's ``weight_decay`` itself every step.

    Returns:
        A ``torch.optim.Adam``: ``param_groups``, ``state_dict`` and ``load_state_dict`` as usual.

    Also calls ``retain_freed_memory()``: every training run builds its optimizer here once.
    """
    retain_freed_memory()
    embedding = _unwrap(model).embedding.weight
    rest = [p for p in model.parameters() if p.requires_grad and p is not embedding]
    groups = [
        {"params": [embedding], "name": "embedding", "embed_l2": embed_l2, "weight_decay": 0.0},
        {"params": rest, "name": "rest", "weight_decay": 0.0},
    ]
    fused = embedding.device.type in ("cpu", "cuda")
    return torch.optim.Adam(groups, lr=lr, fused=fused)


def _embedding_grad_buffer(optimizer: torch.optim.Optimizer, weight: torch.Tensor) -> torch.Tensor:
    """A dense gradient buffer for the embedding, zero except on last step's rows."""
    buffer = getattr(optimizer, "_embed_grad", None)
    if buffer is None or buffer.shape != weight.shape or buffer.device != weight.device:
        buffer = torch.zeros_like(weight)
        optimizer._embed_grad, optimizer._embed_rows = buffer, None
    elif optimizer._embed_rows is not None:
        buffer.index_fill_(0, optimizer._embed_rows, 0.0)
    return buffer


@torch.no_grad()
def _clip_and_attach(model: nn.Module, optimizer: torch.optim.Optimizer,
                     embed_l2: float, clip: float) -> float:
    """Clip the total gradient (L2 term included) to norm ``clip`` and hand it to Adam.

    Returns embed_l2 * ||X||², the value of the L2 term.
    """
    weight = _unwrap(model).embedding.weight
    grad, weight.grad = weight.grad, None
    others = [p.grad for p in model.parameters() if p.grad is not None and p is not weight]
    sq_weight = float(torch.dot(weight.view(-1), weight.view(-1)))
    sq_norm = sum(float(n) ** 2 for n in torch._foreach_norm(others)) if others else 0.0
    two_l2 = 2.0 * embed_l2
    if grad is not None and grad.is_sparse:
        grad = grad.coalesce()
        rows, values = grad.indices()[0], grad.values()                    # unique rows, (R, d)
        decay = weight.index_select(0, rows).mul_(two_l2)                  # 2λ x_r
        sq_norm += (two_l2**2 * sq_weight + float(torch.linalg.vector_norm(decay + values)) ** 2
                    - float(torch.linalg.vector_norm(decay)) ** 2)
    else:
        grad = torch.zeros_like(weight) if grad is None else grad
        grad.add_(weight, alpha=two_l2)                                     # reference: dense
        sq_norm += float(torch.linalg.vector_norm(grad)) ** 2
    coef = min(1.0, clip / (max(sq_norm, 0.0) ** 0.5 + 1e-6))              # as clip_grad_norm_
    if coef < 1.0 and others:
        torch._foreach_mul_(others, coef)
    group = next(g for g in optimizer.param_groups if g.get("name") == "embedding")
    if grad.is_sparse:
        buffer = _embedding_grad_buffer(optimizer, weight)
        buffer.index_copy_(0, rows, values.mul_(coef) if coef < 1.0 else values)
        optimizer._embed_rows = rows
        weight.grad = buffer
        group["weight_decay"] = two_l2 * coef                               # Adam adds wd * x
    else:
        weight.grad = grad.mul_(coef) if coef < 1.0 else grad
        group["weight_decay"] = 0.0
    return embed_l2 * sq_weight


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, *,
               embed_l2: float, clip: float = 5.0, autocast: torch.dtype | None = None) -> float:
    """Forward, loss, backward, gradient-norm clipping and an Adam step on one batch.

    Args:
        model: the reader (training mode is set here).
        optimizer: from ``build_optimizer``.
        batch: on the model's device.
        embed_l2: λ of the embedding L2 term.
        clip: maximum total gradient norm.
        autocast: run the forward under ``torch.autocast`` with this dtype (e.g. bfloat16 on
            CUDA); None keeps full precision.

    Returns:
        The loss, -mean log P(a*) + λ ||X||², as a float.
    """
    model.train()
    device_type = batch.doc.device.type
    amp = torch.autocast(device_type, dtype=autocast) if autocast is not None else nullcontext()
    with amp:
        nll = nll_loss(model(batch).float(), batch.answer)
    for p in model.parameters():
        p.grad = None
    nll.backward()
    l2_value = _clip_and_attach(model, optimizer, embed_l2, clip)
    optimizer.step()
    return float(nll.detach()) + l2_value
