"""The one place where the jobs use private torch names:

- ``TorchDispatchMode``, the base of torch's own ``FlopCounterMode``, which the bench subclasses
  to count FLOPs by operand dtype (no public class sees each matmul with its operands' dtype),
  and an aten op's ``_overloadpacket``, by which ``flop_registry`` keys its formulas;
- ``torch._foreach_norm`` and ``torch._foreach_mul_``, the multi-tensor kernels that
  ``clip_grad_norm_(foreach=True)`` runs, which the training step's clipping calls directly (it
  adds the embedding's L2 term to the norm, which ``clip_grad_norm_`` cannot).

``tests/test_private_apis.py`` checks every name used here against the installed torch, so an
upgrade that moves one fails there, by name.
"""

from __future__ import annotations

import torch

NAMES = (("torch.utils._python_dispatch", "TorchDispatchMode"), ("torch", "_foreach_norm"),
         ("torch", "_foreach_mul_"), ("torch", "ops.aten.mm.default._overloadpacket"))


def foreach_norm(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each of ``tensors``, in one multi-tensor kernel: [0-dim tensor, ...]."""
    return list(torch._foreach_norm(tensors))


def foreach_mul_(tensors: list[torch.Tensor], factor: float | torch.Tensor) -> None:
    """Each of ``tensors`` multiplied in place by ``factor`` (a number or a 0-dim tensor), in one
    multi-tensor kernel."""
    torch._foreach_mul_(tensors, factor)


def dispatch_mode() -> type:
    """torch's ``TorchDispatchMode``: a context whose ``__torch_dispatch__`` sees every aten call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def overload_packet(func: object) -> object:
    """The packet of an aten op overload (``aten.mm`` of ``aten.mm.default``): the key of
    ``torch.utils.flop_counter.flop_registry``."""
    return func._overloadpacket  # type: ignore[attr-defined]
