"""Typed, frozen configuration of the reader and its named presets."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, Mapping, get_args

ModelKind = Literal["iaa", "iaa-fixed-query", "as-reader"]
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)
Halting = Literal["none", "act"]
HALTING_MODES: tuple[str, ...] = get_args(Halting)


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: always finite, within ``low``..``high`` (either may
    be open, or None for no bound). Upper bounds keep a setting below what would hang or overflow."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low, high = _bound(self.low), _bound(self.high)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low} and finite"
        return f"{'<' if self.high_open else '<='} {high} and finite" if self.high is not None else "finite"


def _bound(value: float | None) -> str:
    """A bound short (``8192``, ``1e+09``, ``1e-08``), or in full where short would round it
    (``4294967295``, not ``4.29497e+09``)."""
    if value is None:
        return ""
    short = f"{value:g}"
    return short if float(short) == value or not float(value).is_integer() else str(int(value))


def check_ranges(cfg: Any, ranges: Mapping[str, Range], section: str) -> None:
    """Raise ValueError naming ``section.field`` for the first numeric field outside its range."""
    for name, allowed in ranges.items():
        value = getattr(cfg, name)
        if value not in allowed:
            raise ValueError(f"{section}.{name} must be {allowed}, got {shown_number(value)}")


def shown_number(value: float) -> str:
    """``value`` short: a huge integer as ``1e+30`` (or its number of digits), not 31 digits."""
    if not isinstance(value, int) or abs(value) < 10**15:
        return repr(value)
    if value.bit_length() < 1000:
        return f"{float(value):.3g}"
    return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"


DIM = Range(1, 8192)    # a layer width: beyond this a single matrix no longer fits a machine


@dataclass(frozen=True)
class ReaderConfig:
    """Hyperparameters of the reader (paper section 3 and "Training Details").

    ``vocab_size`` is 0 until a job fills it in from the prepared dataset's vocabulary.
    """

    kind: ModelKind = "iaa"
    vocab_size: int = 0
    embed_dim: int = 384          # d
    hidden_dim: int = 128         # h, per encoder GRU direction
    state_dim: int = 512          # s, inference GRU
    steps: int = 8                # T; with halting="act", the most steps an example may take
    gate_dim: int = 256           # hidden size of the 2-layer search gates g_q, g_d
    dropout: float = 0.2
    candidate_softmax: bool = False  # Stanford AR / GA Reader: attention restricted to candidate positions
    # Beyond the paper: "none" runs all T steps (the paper); "act" lets each example stop early
    # (Adaptive Computation Time, Graves 2016; iaa/model/halting.py), at a training cost of
    # ponder_cost * (N + R) per example.
    halting: Halting = "none"
    ponder_cost: float = 0.001       # τ
    halt_bias_init: float = -1.0     # b_t at the start: h_t ≈ σ(-1) = 0.27, so about 4 steps at first
    # Implementation switches: each turns off a fast path of iaa/model/kernels (same mathematics;
    # docs/kernels.md), except sparse_embedding_grad, the embedding's gradient layout.
    fused_gru: bool = True           # the encoders' fast BiGRU instead of nn.GRU + packing: CPU, packed and
                                     # hand-differentiated; CUDA (h <= 128), two cuDNN GRUs over padded rows
    triton_gru: bool = False         # CUDA with Triton (pip install -e '.[triton]'): the encoders' BiGRU as
                                     # one persistent Triton kernel per pass instead (h <= 256)
    fast_dropout: bool = True        # 16-bit-lane dropout masks instead of F.dropout
    sparse_embedding_grad: bool = True  # sparse embedding gradient; iaa.jobs.training.step keeps Adam + L2 exact
    batched_read_grad: bool = True   # one GEMM for the gradient of all T document reads
    inference_table: bool = True     # inference: per-word cache of the doc encoder's input projection

    RANGES: ClassVar[dict[str, Range]] = {
        "vocab_size": Range(0, 10_000_000), "embed_dim": DIM, "hidden_dim": DIM, "state_dim": DIM,
        "steps": Range(1, 256), "gate_dim": DIM, "dropout": Range(0.0, 1.0, high_open=True),
        "ponder_cost": Range(0.0, 100.0), "halt_bias_init": Range(-100.0, 100.0),
    }

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {self.kind!r}")
        check_ranges(self, self.RANGES, "model")
        if self.halting not in HALTING_MODES:
            raise ValueError(f"halting must be one of {HALTING_MODES}, got {self.halting!r}")
        if self.halting == "act" and self.kind == "as-reader":
            raise ValueError("halting='act' needs an iterative reader (iaa or iaa-fixed-query); the AS Reader has one step")


PRESETS: dict[str, ReaderConfig] = {
    "paper": ReaderConfig(embed_dim=384, hidden_dim=128, state_dim=512, steps=8, gate_dim=256),
    "demo": ReaderConfig(embed_dim=64, hidden_dim=64, state_dim=128, steps=3, gate_dim=64),
    "tiny": ReaderConfig(embed_dim=16, hidden_dim=8, state_dim=12, steps=2, gate_dim=10),
}


def preset(name: str, **overrides: object) -> ReaderConfig:
    """A named preset, with field overrides."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)  # type: ignore[arg-type]
