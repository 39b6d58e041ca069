"""The IAA reader and its baselines, in plain PyTorch; their fast paths in ``kernels``. Imports
only torch.

The configs (:mod:`iaa.model.config`) load without torch, so a command that only reads a config
(or fails on its input) starts at once; the modules below are imported on first use.
"""

from importlib import import_module
from typing import Any

from iaa.model.config import MODEL_KINDS, PRESETS, ReaderConfig, preset

_LAZY = {
    "masked_softmax": "iaa.model.masking", "masked_log_softmax": "iaa.model.masking",
    "pointer_sum": "iaa.model.pointer", "nll_loss": "iaa.model.pointer", "candidate_probs": "iaa.model.pointer",
    "IAAReader": "iaa.model.reader", "ASReader": "iaa.model.reader", "build_reader": "iaa.model.reader",
    "StepTrace": "iaa.model.reader", "Trace": "iaa.model.reader", "ReaderOutput": "iaa.model.reader",
}

__all__ = [
    "MODEL_KINDS", "PRESETS", "ReaderConfig", "preset",
    "masked_softmax", "masked_log_softmax",
    "pointer_sum", "nll_loss", "candidate_probs",
    "IAAReader", "ASReader", "build_reader", "StepTrace", "Trace", "ReaderOutput",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'iaa.model' has no attribute {name!r}")
