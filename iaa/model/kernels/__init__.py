"""The reader's fast paths, behind one seam: ``select(device, precision, cfg)``.

``iaa.model`` is the paper's reader in plain PyTorch, and that is the reference. Each kernel
here computes one part of it faster, on the devices and for the readers it declares
(``support.Support``); for anything else the reference runs, never other equations:

==========  ==============================================  =========================
slot        kernel                                           replaces
==========  ==============================================  =========================
encoder     ``fused_gru.FusedEncoder`` (C++ recurrence:      ``nn.GRU`` over packed
            generic, AVX-512, AMX; else Python loops)        sequences
table       ``fused_gru.EncoderTable``                       the document encoder in
                                                             inference
reads       ``deferred.DeferredReads``                       the document reads' autograd
layers      ``precision.SmallMatmuls``                       the steps' layers under bf16
steps       ``inference_steps.FusedSteps``                   the T steps in inference
dropout     ``dropout.FastDropout``                          ``F.dropout``
==========  ==============================================  =========================

Precision is an argument ("fp32" or "bf16"), chosen once with the kernels when the reader is
built. Nothing else switches the arithmetic: no global, no thread-local, no environment
variable (``IAA_NO_COMPILED_KERNELS=1`` only skips building the C++ kernels, for debugging).
Kernels import only torch and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from iaa.model.kernels.deferred import DeferredReads
from iaa.model.kernels.dropout import FastDropout
from iaa.model.kernels.fused_gru import EncoderTable, FusedEncoder
from iaa.model.kernels.inference_steps import FusedSteps
from iaa.model.kernels.precision import SmallMatmuls
from iaa.model.kernels.support import EQUATIONS, PRECISIONS, Kernel, Support

KERNELS: tuple[type[Kernel], ...] = (FusedEncoder, EncoderTable, DeferredReads, SmallMatmuls, FusedSteps,
                                     FastDropout)

__all__ = ["EQUATIONS", "KERNELS", "Kernel", "Kernels", "Support", "select"]


@dataclass
class Kernels:
    """The kernels a reader runs, one per slot; None: the reference (``iaa.model``) runs there."""

    device: str = "cpu"
    precision: str = "fp32"
    encoder: FusedEncoder | None = None
    table: EncoderTable | None = None
    reads: DeferredReads | None = None
    layers: SmallMatmuls | None = None
    steps: FusedSteps | None = None
    dropout: FastDropout | None = None

    def chosen(self) -> dict[str, str]:
        """The kernel of each slot that has one, by name: {"encoder": "FusedEncoder", ...}."""
        return {f.name: type(k).__name__ for f in fields(self)
                if (k := getattr(self, f.name)) is not None and f.name not in ("device", "precision")}

    def forget(self) -> None:
        """Drop every cache of weights (before a training pass changes them)."""
        for kernel in (self.table, self.steps):
            if kernel is not None:
                kernel.forget()

    def amx_recurrence(self, hidden: int) -> bool:
        """Whether the encoders' recurrent matmuls multiply on AMX (bf16 training and inference)."""
        return self.encoder is not None and self.encoder.amx_recurrence(hidden)

    def amx_step_layers(self) -> bool:
        """Whether the attention steps' layers multiply on AMX in training."""
        return self.layers is not None and self.layers.on_amx(grad=True)


def select(device: str | torch.device, precision: str, cfg: Any) -> Kernels:
    """The kernels for a reader of config ``cfg`` on ``device`` in ``precision`` (fp32 | bf16).

    A kernel is chosen where its config switch (``Kernel.switch``) is on, it declares the
    reader's equations, the device and the precision (``Support.covers``), and it can run here
    (``Kernel.make``); each other slot runs the reference.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    device = torch.device(device).type
    chosen: dict[str, Kernel] = {}
    for kernel in KERNELS:
        if kernel.switch is not None and not getattr(cfg, kernel.switch):
            continue
        if kernel.support.covers(cfg, device, precision):
            made = kernel.make(cfg, precision)
            if made is not None:
                chosen[kernel.slot] = made
    return Kernels(device, precision, **chosen)
