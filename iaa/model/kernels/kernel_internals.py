"""The one place where the kernels read a private torch name: a tensor's version counter
(``Tensor._version``), which every in-place change bumps. The caches of packed or tabulated
weights (``encoder_table.EncoderTable``, ``inference_steps.FusedSteps``) are keyed by it; no public
API says whether a tensor changed in place.

``tests/test_private_apis.py`` checks every name used here against the installed torch, so an
upgrade that moves one fails there, by name.
"""

from __future__ import annotations

import torch

NAMES = (("torch", "Tensor._version"),)


def version(tensor: torch.Tensor) -> int:
    """How many times ``tensor`` was changed in place (an optimiser that writes through
    ``.data`` or a fused kernel may change it without counting)."""
    return tensor._version
