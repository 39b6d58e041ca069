"""What a kernel declares: the part of the reader it replaces, the readers it computes exactly as
the reference does, and where it runs. ``select`` (``iaa.model.kernels``) reads nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Protocol

# The fields of the reader's config that change its equations. A kernel names the values of
# each that it computes as the reference does; for any other value (a new model kind, a new
# halting rule) the reference runs. A new such field goes here, and every kernel falls back
# until it declares that field's values.
EQUATIONS = ("kind", "halting", "candidate_softmax")

# The values every kernel that is indifferent to the variant declares (each listed by name, so
# that a new variant is not covered by accident).
ALL_VARIANTS: Mapping[str, frozenset] = {
    "kind": frozenset({"iaa", "iaa-fixed-query", "as-reader"}),
    "halting": frozenset({"none", "act"}),
    "candidate_softmax": frozenset({False, True}),
}
PRECISIONS = frozenset({"fp32", "bf16"})


@dataclass(frozen=True)
class Support:
    """The readers (by their ``EQUATIONS`` fields), device types and precisions of a kernel."""

    devices: frozenset[str]
    equations: Mapping[str, frozenset] = field(default_factory=lambda: ALL_VARIANTS)
    precisions: frozenset[str] = PRECISIONS

    def covers(self, cfg: Any, device: str, precision: str) -> bool:
        """Whether the kernel computes ``cfg``'s reader on ``device`` in ``precision``."""
        return (device in self.devices and precision in self.precisions
                and all(getattr(cfg, name) in self.equations.get(name, ()) for name in EQUATIONS))


class Kernel(Protocol):
    """A fast path of one part (``slot``) of the reader.

    ``switch`` names the config field (a bool) that turns it off, if any. ``make`` returns the
    kernel for a reader, or None where it cannot run here (not built, an instruction set the
    CPU lacks, sizes it does not handle). A kernel instance belongs to one reader: caches in it
    (weights packed or tabulated) serve that reader only, and ``forget`` drops them.
    """

    slot: ClassVar[str]
    switch: ClassVar[str | None]
    support: ClassVar[Support]

    @classmethod
    def make(cls, cfg: Any, precision: str) -> "Kernel | None": ...
