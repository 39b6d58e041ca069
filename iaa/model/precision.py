"""Which dtype a matmul computes in: autocast's, when it is on.

``train.precision=bf16`` runs the reader under ``torch.autocast(device, torch.bfloat16)``. On the
CPU, the fused encoder and the inference table (``fused_gru``) and the attention reads
(``attention.Memory``) then give their large matmuls bf16 operands explicitly, and keep in fp32
what is faster or needs to be exact there: the small recurrent ``h W_hh`` matmuls, the gate
arithmetic, the softmaxes and the pointer-sum. Parameters never change dtype.
"""

from __future__ import annotations

import torch


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """Autocast's dtype on ``device_type`` ("cpu", "cuda"), or None when autocast is off there
    (or does not exist for that device type)."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``tensor`` runs in here: autocast's, when it is on for its device
    (autocast casts floating-point tensors other than float64)."""
    dtype = autocast_dtype(tensor.device.type)
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != torch.float64:
        return dtype
    return tensor.dtype


def cpu_bf16() -> bool:
    """Whether CPU matmuls of the reader compute in bf16 here (CPU autocast with bfloat16)."""
    return autocast_dtype("cpu") == torch.bfloat16
