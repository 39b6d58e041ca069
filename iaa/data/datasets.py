"""The datasets the project knows, by name: the one list that the CLI, presets and prepare share."""

from __future__ import annotations

DATASETS: tuple[str, ...] = ("demo", "cbt-ne", "cbt-cn", "cbt-v", "cbt-p", "cnn")
TRAINING_SPLITS = ("train", "valid")    # what a command that trains reads: it checks on valid
# Those with a hyperparameter-search preset: all of them (the paper tuned on CBT NE and CN, and
# on CNN; CBT's V and P share the CBT sweep).
TUNE_DATASETS: tuple[str, ...] = DATASETS
# The question styles `make-cloze` writes: every dataset but the generated demo.
CLOZE_STYLES: tuple[str, ...] = tuple(name for name in DATASETS if name != "demo")
