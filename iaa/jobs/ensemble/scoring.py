"""The ensemble's scoring pass, said before it starts and shown while it runs: every member reads
every valid (and test) question once; and the baseline its accuracies are shown beside."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def split_sizes(prepared: Path) -> dict[str, int]:
    """Questions in the valid and test splits of the prepared folder (0 where a split is absent)."""
    from iaa.data.prepared.manifest import counted

    return {split: counted(Path(prepared), split) for split in ("valid", "test")}


def cost_line(members: int, sizes: Mapping[str, int], name: str) -> str:
    """What the pass costs, in reader passes over questions, before it starts."""
    per_member = sum(sizes.values())
    splits = " and ".join(f"{split} ({n} questions)" for split, n in sizes.items() if n)
    return (f"ensemble {name}: scoring {members} member{'' if members == 1 else 's'} on {splits}: {members} x "
            f"{per_member} = {members * per_member} questions read, one reader pass each")


def accuracy_keys(summary: Mapping[str, Any], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``valid_acc_n``/``valid_acc_stderr`` and the test's, beside the ensemble's accuracies."""
    from iaa.jobs.evaluation import uncertainty

    return {**uncertainty.fields("valid_acc", summary.get("valid_acc"), sizes["valid"]),
            **uncertainty.fields("test_acc", summary.get("test_acc"), sizes["test"])}


def baselines(prepared: Path) -> dict[str, float]:
    """The most-frequent-candidate accuracy on valid and, where the data has a test split, on test:
    ``baseline_valid_acc`` and ``baseline_test_acc``, beside which the ensemble's are shown."""
    from iaa.jobs.evaluation import frequency

    sizes = split_sizes(prepared)
    return {f"baseline_{split}_acc": frequency.run(Path(prepared), split).accuracy
            for split in ("valid", "test") if sizes[split]}
