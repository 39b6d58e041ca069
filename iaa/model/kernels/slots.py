"""The reader's slots: the chosen kernels as plain functions over tensors and weights.

``Kernels.slots`` hands the reader one function per slot, None where no kernel serves there. A
slot takes tensors and the weights it needs (tensors, or the reader's ``nn.Linear``, ``nn.GRU``
and ``nn.GRUCell``, handed to it explicitly) and returns tensors, or an object whose methods do
(``reads``, ``layers``). It never calls back into the reader and holds none of the reader's own
functions: the reader keeps its equations and decides, one switch per slot, where a slot
replaces a piece of them (``iaa.model.reader``).

Every function is a small object over its kernel (``KernelMethod``; the kernel itself for
dropout), never a closure, so that a deep copy of a reader copies its kernels' caches with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Slots:
    """One function per slot (names as ``Kernels``' fields), None where the reference runs:

    encoder: (x (B, L, d), lengths (B,) beside x, gru) -> states (B, L, 2h), 0 at padding: the
        BiGRU of a ``BiGRUEncoder`` over the same parameters.
    table: (tokens (B, L), lengths (B,), embedding (V, d), gru) -> states (B, L, 2h) of ``gru``
        over the tokens' embeddings, 0 at padding. Inference only: no gradient, no input dropout.
    reads: (d̃ (B, Ld, 2h)) -> the document's reads for the steps, with ``Encodings``' methods
        (``logits``, ``glimpse``, ``select``).
    layers: (grad) -> a context manager yielding how the steps apply their layers in one forward
        pass, with ``Layers``' methods (``linear``, ``gru_cell``); ``grad``: whether gradients flow.
    steps: (layers, cell, q̃ (B, Lq, 2h), d̃ (B, Ld, 2h), query mask, doc mask, T) -> the last
        step's document logits (B, Ld): the IAA reader's T steps, with ``layers`` A_q, A_d and
        the two layers of g_q and of g_d, ``cell`` the inference GRU. Inference only: no
        gradient, no trace.
    dropout: (x, p) -> x with inverted dropout p (training only; the caller skips p = 0).
    """

    encoder: Callable | None = None
    table: Callable | None = None
    reads: Callable | None = None
    layers: Callable | None = None
    steps: Callable | None = None
    dropout: Callable | None = None


@dataclass(frozen=True)
class KernelMethod:
    """A kernel's method as a slot's function: ``kernel.<name>(*args)``, looked up at each call,
    so that a method replaced on the kernel's class after the reader was built (a test's spy)
    is the one that runs."""

    kernel: Any
    name: str

    def __call__(self, *args: Any) -> Any:
        return getattr(self.kernel, self.name)(*args)


def method(kernel: Any, name: str) -> KernelMethod | None:
    """``kernel``'s method ``name`` as a slot's function; None without a kernel."""
    return None if kernel is None else KernelMethod(kernel, name)
