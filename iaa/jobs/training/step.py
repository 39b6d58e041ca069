"""One training step and its optimiser: the only place the training mathematics lives.

The objective (paper, "Training Details") is

    loss = -mean log P(a* | Q, D) + embed_l2 * ||X||²       (X: the word embedding)

where a teacher's soft targets or ACT's ponder cost may add terms to the first part
(:mod:`iaa.jobs.modeling.objective`).

with the gradient clipped to norm ``clip`` (over all parameters, the L2 term included) and Adam.
The training loop (in process, in a Tune trial or on Ray Train workers) and the benchmarks all
call ``build_optimizer`` and ``train_step``, so every caller gets the fast path. λ lives in the
:class:`Optimizer` (``embed_l2``), the one place ``train_step`` reads it from.

Fast path, same mathematics. A dense Adam update of the 50,000 x 384 embedding is needed for
exactness: with the L2 term every row has a gradient (2 λ x_r) every step, and Adam's moments
move rows that the batch did not touch. What is avoided is everything else that is dense:

- On the CPU the embedding's data gradient stays sparse (``sparse_embedding_grad``): no
  zero-fill of a 77 MB gradient and no dense scatter. On a GPU it is dense: coalescing a sparse
  gradient reads its size back to the host, and a GPU step reads nothing back.
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

import torch
from torch import nn

from iaa.data.loading.batch import Batch
from iaa.jobs.modeling.checkpoint import unwrap
from iaa.jobs.modeling.objective import Objective
from iaa.jobs.training.torch_internals import foreach_mul_, foreach_norm


def retain_freed_memory() -> bool:
    """Keep freed memory in the process heap instead of returning it to the OS (glibc only).

    Why: a training step at the paper config allocates and frees ~200 MB of activations in blocks
    above glibc's mmap threshold, so each is a fresh mmap whose pages the kernel faults in and
    zeroes again: ~47,000 page faults per batch, ~13% of a step's CPU time (benchmarks/HISTORY.md).
    Cost: resident memory stays at its peak, and the heap grows where block sizes never recur
    (the CPU loop pads the batches' widths for that: ``iaa.data.loading.batch.pad_to_multiple``).
    Process-wide and idempotent; returns whether it applied.
    Nothing calls it implicitly: an entry point opts in once at process start (``iaa.jobs.train.train.run``,
    ``iaa-cli bench`` and the benchmark scripts do).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


class Optimizer:
    """Adam (fused where the device allows) plus the embedding's sparse-gradient bookkeeping.

    Holds λ (``embed_l2``, the one place it lives during training) and the dense gradient buffer
    of the embedding (zero except on last step's rows, which the next step re-zeroes).
    ``state_dict`` / ``load_state_dict`` round-trip Adam's state (moments, step, learning rate);
    the buffer is rebuilt on demand, so a checkpoint holds no copy of it.

    Build it after the model is on its device: Adam's state is created, and loaded, on the
    parameters' device.
    """

    def __init__(self, model: nn.Module, lr: float, embed_l2: float, capturable: bool = False) -> None:
        self.embedding = _embedding_weight(model)
        self.embed_l2 = float(embed_l2)
        self.capturable = capturable
        rest = [p for p in model.parameters() if p.requires_grad and p is not self.embedding]
        groups = [{"params": [self.embedding], "name": "embedding", "weight_decay": 0.0},
                  {"params": rest, "name": "rest", "weight_decay": 0.0}]
        fused = self.embedding.device.type in ("cpu", "cuda")
        if capturable:   # the step's count and lr on the device, so that a CUDA graph reads them there
            lr_value = torch.tensor(float(lr), dtype=torch.float32, device=self.embedding.device)
            self.adam = torch.optim.Adam(groups, lr=lr_value, fused=True, capturable=True)
        else:
            self.adam = torch.optim.Adam(groups, lr=lr, fused=fused)
        self._grad_buffer: torch.Tensor | None = None
        self._touched_rows: torch.Tensor | None = None

    @property
    def param_groups(self) -> list[dict]:
        return self.adam.param_groups

    @property
    def _embed_group(self) -> dict:
        """The embedding's group (looked up each time: ``load_state_dict`` replaces the dicts)."""
        return self.adam.param_groups[0]

    @property
    def lr(self) -> float:
        return float(self.adam.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        """Every group's learning rate; a capturable optimiser's is written into its device
        tensor, so that steps captured before see the new value."""
        for group in self.adam.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def state_dict(self) -> dict:
        """Adam's state, with the learning rates as floats whatever the optimiser holds."""
        state = self.adam.state_dict()
        if self.capturable:
            state["param_groups"] = [{**g, "lr": float(g["lr"])} for g in state["param_groups"]]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Adam's saved state, moved to the parameters' device and dtype. The optimiser keeps its
        own kind (fused, capturable, a device learning rate): the state may come from either."""
        flags = [{k: g[k] for k in ("fused", "capturable", "foreach") if k in g} for g in self.adam.param_groups]
        self.adam.load_state_dict(state)
        for group, own in zip(self.adam.param_groups, flags):
            group.update(own)
            if self.capturable:
                lr = float(group["lr"])
                group["lr"] = torch.tensor(lr, dtype=torch.float32, device=self.embedding.device)
                for p in group["params"]:
                    st = self.adam.state.get(p, {})
                    if "step" in st:
                        st["step"] = st["step"].to(device=p.device, dtype=torch.float32)

    def step(self) -> None:
        self.adam.step()

    def embedding_grad_buffer(self) -> torch.Tensor:
        """A dense gradient buffer for the embedding, zero except on last step's rows."""
        weight, buffer = self.embedding, self._grad_buffer
        if buffer is None or buffer.shape != weight.shape or buffer.device != weight.device:
            buffer = self._grad_buffer = torch.zeros_like(weight)
        elif self._touched_rows is not None:
            buffer.index_fill_(0, self._touched_rows, 0.0)
        self._touched_rows = None
        return buffer

    def attach_sparse_grad(self, rows: torch.Tensor, values: torch.Tensor, l2_coef: float) -> None:
        """The embedding's gradient: ``values`` on ``rows`` plus ``l2_coef * X``, added by Adam."""
        buffer = self.embedding_grad_buffer()
        buffer.index_copy_(0, rows, values)
        self._touched_rows = rows
        self.embedding.grad = buffer
        self._embed_group["weight_decay"] = l2_coef                         # Adam adds wd * x

    def attach_dense_grad(self, grad: torch.Tensor) -> None:
        self.embedding.grad = grad
        self._embed_group["weight_decay"] = 0.0


def _embedding_weight(model: nn.Module) -> torch.Tensor:
    """The word embedding of a reader, or of the reader inside a DDP (or similar) wrapper."""
    return unwrap(model).embedding.weight


def build_optimizer(model: nn.Module, lr: float, embed_l2: float, capturable: bool = False) -> Optimizer:
    """The training optimiser of ``model`` (a reader from ``iaa.model.build_reader``, or a
    wrapper with ``.module``): Adam with learning rate ``lr`` and the embedding L2 weight λ.

    ``capturable``: Adam's step count and learning rate live on the parameters' device, so that
    its step can be captured in a CUDA graph (``iaa.jobs.training.captured``); same updates.
    """
    return Optimizer(model, lr, embed_l2, capturable)


def clip_coefficient(sq_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """min(1, max_norm / (norm + 1e-6)) as a device tensor, from the squared total norm: the
    factor ``clip_grad_norm_`` scales the gradients by, without reading the norm back."""
    return (max_norm / (sq_norm.clamp_min(0.0).sqrt() + 1e-6)).clamp_max(1.0)


@torch.no_grad()
def _clip_and_attach(model: nn.Module, optimizer: Optimizer, clip: float) -> torch.Tensor:
    """Clip the total gradient (L2 term included) to norm ``clip`` and hand it to Adam.

    The squared norms are summed in float64 on the parameters' device. With a dense embedding
    gradient (always on a GPU) nothing is read back: the clipping coefficient stays a device
    tensor and multiplies every gradient in one ``_foreach_mul_``, as ``clip_grad_norm_(foreach=True)``
    does. The sparse CPU path reads the norm once (free on a CPU) to skip the multiplications when
    nothing is clipped. Returns λ ||X||², the value of the L2 term, as a 0-dim device tensor.
    """
    weight, embed_l2 = optimizer.embedding, optimizer.embed_l2
    grad, weight.grad = weight.grad, None
    others = [p.grad for p in model.parameters() if p.grad is not None and p is not weight]
    sq = lambda t: t.double().square()                                     # noqa: E731 (float64 sums)
    sq_weight = torch.dot(weight.view(-1), weight.view(-1)).double()
    sq_norm = sq(torch.stack(foreach_norm(others))).sum() if others else sq_weight.new_zeros(())
    two_l2 = 2.0 * embed_l2
    if grad is not None and grad.is_sparse:
        grad = grad.coalesce()
        rows, values = grad.indices()[0], grad.values()                    # unique rows, (R, d)
        decay = weight.index_select(0, rows).mul_(two_l2)                  # 2λ x_r
        sq_norm = (sq_norm + two_l2**2 * sq_weight + sq(torch.linalg.vector_norm(decay + values))
                   - sq(torch.linalg.vector_norm(decay)))
        coef = min(1.0, clip / (max(float(sq_norm), 0.0) ** 0.5 + 1e-6))  # as clip_grad_norm_
        if coef < 1.0 and others:
            foreach_mul_(others, coef)
        optimizer.attach_sparse_grad(rows, values.mul_(coef) if coef < 1.0 else values, two_l2 * coef)
        return embed_l2 * sq_weight
    grad = torch.zeros_like(weight) if grad is None else grad
    grad.add_(weight, alpha=two_l2)                                         # the L2 gradient, dense
    sq_norm = sq_norm + sq(torch.linalg.vector_norm(grad))
    coef = clip_coefficient(sq_norm, clip)                                 # as clip_grad_norm_
    foreach_mul_([*others, grad], coef.to(grad.dtype))                     # x 1.0 when not clipped
    optimizer.attach_dense_grad(grad)
    return embed_l2 * sq_weight


def train_step(model: nn.Module, optimizer: Optimizer, batch: Batch, *,
               clip: float = 5.0, objective: Objective = Objective()) -> float:
    """Forward, loss, backward, gradient-norm clipping and an Adam step on one batch.

    Args:
        model: the reader (training mode is set here).
        optimizer: from ``build_optimizer`` (it holds λ).
        batch: on the model's device.
        clip: maximum total gradient norm.
        objective: the loss of the batch (default: the paper's NLL).

    Returns:
        The loss, -mean log P(a*) (or ``objective``'s loss) + λ ||X||², as a 0-dim float64
        tensor on the model's device. Nothing here reads a value back to the host on a GPU (no
        sync): the caller sums the losses as tensors and reads them when it reports.
    """
    model.train()
    out = model(batch)                                                     # ReaderOutput
    loss = objective(out.log_probs.float(), batch, out.halting)            # (B, C) in the reader's precision; fp32
    for p in model.parameters():
        p.grad = None
    loss.backward()
    l2_value = _clip_and_attach(model, optimizer, clip)
    optimizer.step()
    return loss.detach() + l2_value
