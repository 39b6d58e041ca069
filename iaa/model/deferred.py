"""A gradient assembled once, after every use of a tensor (``attention.Memory``'s reads,
``precision``'s AMX layers): the uses record factors instead of returning gradients, and an
identity placed before them asks for the sum in one product when autograd reaches it."""

from __future__ import annotations

from typing import Protocol

import torch


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
