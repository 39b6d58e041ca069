"""The reader's fast paths, behind one seam: ``select(device, precision, cfg)``.

``iaa.model`` is the paper's reader in plain PyTorch, and that is the reference. Each kernel
here computes one part of it faster, on the devices and for the readers it declares
(``support.Support``); for anything else the reference runs, never other equations:

==========  ==============================================  =========================
slot        kernel                                           replaces
==========  ==============================================  =========================
encoder     ``fused_gru.FusedEncoder`` (C++ recurrence:      ``nn.GRU`` over packed
            generic, AVX-512, AMX; else Python loops)        sequences
encoder     ``padded_gru.PaddedGRU`` (CUDA, h <= 128: two    ``nn.GRU`` over packed
            one-direction cuDNN GRUs over padded rows)       sequences
encoder     ``triton_gru.TritonGRU`` (CUDA with Triton,      ``nn.GRU`` over packed
            h <= 256, ``model.triton_gru``: one              sequences
            persistent kernel per pass, both directions)
table       ``encoder_table.EncoderTable``                   the document encoder in
                                                             inference
reads       ``deferred.DeferredReads``                       the document reads' autograd
layers      ``precision.SmallMatmuls``                       the steps' layers under bf16
steps       ``inference_steps.FusedSteps``                   the T steps in inference
dropout     ``dropout.FastDropout``                          ``F.dropout``
==========  ==============================================  =========================

``Kernels.slots`` hands the reader the choice as one plain function per slot (``slots.Slots``):
it takes tensors and weights and returns tensors, never calls back into the reader, and is None
where no kernel serves. The reader keeps its own equations and switches to a slot at one site
each; a kernel that computes only inference (``table``, ``steps``) is used only in eval mode
without gradients (and, for ``steps``, without a trace). ``Kernels.forget`` drops the kernels'
caches of weights. ``Kernels.describe`` says what runs, and ``cpu_features`` what the CPU offers,
for reports and benchmarks.

Precision is an argument ("fp32" or "bf16"), chosen once with the kernels when the reader is
built. Nothing else switches the arithmetic: no global, no thread-local, no environment
variable (``IAA_NO_COMPILED_KERNELS=1`` only skips building the C++ kernels, for debugging).
Kernels import only torch and the standard library, and ``triton_gru`` Triton (an optional
extra) when it runs. Where two kernels cover a slot, the later one in ``KERNELS`` is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from iaa.model.kernels.deferred import DeferredReads
from iaa.model.kernels.dropout import FastDropout
from iaa.model.kernels.encoder_table import EncoderTable
from iaa.model.kernels.fused_gru import FusedEncoder
from iaa.model.kernels.gru_kernels import cpu_features
from iaa.model.kernels.inference_steps import FusedSteps
from iaa.model.kernels.padded_gru import PaddedGRU
from iaa.model.kernels.precision import SmallMatmuls
from iaa.model.kernels.slots import Slots, method
from iaa.model.kernels.support import EQUATIONS, PRECISIONS, Kernel, Support
from iaa.model.kernels.triton_gru import TritonGRU

KERNELS: tuple[type[Kernel], ...] = (FusedEncoder, PaddedGRU, TritonGRU, EncoderTable, DeferredReads,
                                     SmallMatmuls, FusedSteps, FastDropout)

__all__ = ["EQUATIONS", "KERNELS", "Kernel", "Kernels", "Slots", "Support", "cpu_features", "select"]

_CONTEXT = ("device", "precision", "hidden_dim")


@dataclass
class Kernels:
    """The kernels a reader runs, one per slot; None: the reference (``iaa.model``) runs there.

    ``hidden_dim``: the encoders' h, which ``describe`` reports the AMX recurrence for.
    """

    device: str = "cpu"
    precision: str = "fp32"
    encoder: Any = None          # FusedEncoder, PaddedGRU, TritonGRU: any kernel with encode(x, lengths, gru)
    table: EncoderTable | None = None
    reads: DeferredReads | None = None
    layers: SmallMatmuls | None = None
    steps: FusedSteps | None = None
    dropout: FastDropout | None = None
    hidden_dim: int | None = None

    def chosen(self) -> dict[str, str]:
        """The kernel of each slot that has one, by name: {"encoder": "FusedEncoder", ...}."""
        return {f.name: type(k).__name__ for f in fields(self)
                if (k := getattr(self, f.name)) is not None and f.name not in _CONTEXT}

    def describe(self) -> dict[str, Any]:
        """What runs, for reports and benchmarks: device, precision, the kernel of each slot
        (``chosen``), and whether the encoders' recurrent matmuls (``amx_recurrence``) and the
        attention steps' layers in training (``amx_step_layers``) multiply on AMX."""
        recurrence = getattr(self.encoder, "amx_recurrence", None)
        on_amx = getattr(self.layers, "on_amx", None)
        return {"device": self.device, "precision": self.precision, "slots": self.chosen(),
                "amx_recurrence": bool(recurrence is not None and self.hidden_dim is not None
                                       and recurrence(self.hidden_dim)),
                "amx_step_layers": bool(on_amx is not None and on_amx(grad=True))}

    def slots(self) -> Slots:
        """The chosen kernels as one function per slot (``slots.Slots``), None where the
        reference runs."""
        return Slots(encoder=method(self.encoder, "encode"), table=method(self.table, "encode"),
                     reads=method(self.reads, "memory"), layers=method(self.layers, "block"),
                     steps=method(self.steps, "last_logits"), dropout=self.dropout)

    def forget(self) -> None:
        """Drop the kernels' caches of weights (the table's projections, the steps' packed
        weights). The reader calls this at each training pass: an optimiser may change the
        weights in place without bumping their version (fused Adam does not), so a cache keyed
        by version alone could serve stale ones."""
        for kernel in (self.table, self.steps):
            if kernel is not None:
                kernel.forget()


def select(device: str | torch.device, precision: str, cfg: Any) -> Kernels:
    """The kernels for a reader of config ``cfg`` on ``device`` in ``precision`` (fp32 | bf16).

    A kernel is chosen where its config switch (``Kernel.switch``) is on, it declares the
    reader's equations, the device and the precision (``Support.covers``), and it can run here
    (``Kernel.make``); each other slot runs the reference. ``Kernels.slots`` turns the choice
    into one function per slot.
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
    return Kernels(device, precision, **chosen, hidden_dim=getattr(cfg, "hidden_dim", None))
