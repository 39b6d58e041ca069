"""The private torch names of ``iaa.model``:

- a tensor's version counter (``Tensor._version``), which every in-place change bumps, read here
  for the kernels: the caches of packed or tabulated weights (``encoder_table.EncoderTable``,
  ``inference_steps.FusedSteps``) are keyed by it; no public API says whether a tensor changed in
  place;
- ``nn.Module._apply``, which the reader overrides (``iaa.model.reader``): ``.to()``, ``.cuda()``
  and ``.cpu()`` all move a module's tensors through it, so that is where the reader chooses its
  kernels again for the device it moved to; no public hook runs after a move.

``tests/test_private_apis.py`` checks every name listed here against the installed torch, so an
upgrade that moves one fails there, by name.
"""

from __future__ import annotations

import torch

NAMES = (("torch", "Tensor._version"), ("torch.nn", "Module._apply"))


def version(tensor: torch.Tensor) -> int:
    """How many times ``tensor`` was changed in place (an optimiser that writes through
    ``.data`` or a fused kernel may change it without counting)."""
    return tensor._version
