"""The IAA reader and its baselines. Imports only torch."""

from iaa.model.config import MODEL_KINDS, PRESETS, ReaderConfig, preset
from iaa.model.masking import masked_log_softmax, masked_softmax
from iaa.model.pointer import candidate_probs, nll_loss, pointer_sum
from iaa.model.reader import ASReader, IAAReader, build_reader

__all__ = [
    "MODEL_KINDS", "PRESETS", "ReaderConfig", "preset",
    "masked_softmax", "masked_log_softmax",
    "pointer_sum", "nll_loss", "candidate_probs",
    "IAAReader", "ASReader", "build_reader",
]
