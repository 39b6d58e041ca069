"""Training and inference throughput on a synthetic CBT-NE-shaped workload.

The workload is fixed so that implementations are compared on the same work: document lengths
~ N(430, 110²) clipped to [130, 1000], query lengths ~ N(28, 12²) clipped to [3, 120], 10
candidates per example (each occurring 1-6 times in the document), a 50,000-word vocabulary with
Zipf-like word frequencies, the paper's model configuration and batch 32.

Training batches are length-bucketed, as the real loader's are (and as the AS Reader's and GA
Reader's loaders were): a pool of examples is sorted by document length, cut into batches and the
batch order shuffled. ``iaa-cli bench`` prints the dict that ``run`` returns.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

import numpy as np
import torch

from iaa.data.loading.batch import Batch, pad_to_buckets
from iaa.model import kernels as fast
from iaa.model.config import PRESETS, ReaderConfig
from iaa.jobs.train.flops import batch_flops, batch_recurrent_flops, step_layer_flops
from iaa.model.reader import build_reader
from iaa.jobs.config.job_config import ConfigError, merge
from iaa.jobs.evaluation.result import Result, absent_when_none
from iaa.jobs.modeling import precision_policy as precision_lib
from iaa.jobs.training.step import build_optimizer, retain_freed_memory, train_step

VOCAB_SIZE = 50_000
NUM_CANDS = 10
EMBED_L2 = 1e-4
LR = 1e-3


@dataclass
class Example:
    doc: np.ndarray       # (Ld,) int64
    query: np.ndarray     # (Lq,) int64
    doc_cand: np.ndarray  # (Ld,) int64, -1 for no candidate
    answer: int


def _lengths(rng: np.random.Generator, n: int, mean: float, std: float, lo: int, hi: int) -> np.ndarray:
    return np.clip(np.rint(rng.normal(mean, std, n)), lo, hi).astype(np.int64)


def synthetic_examples(n: int, seed: int = 0, vocab_size: int = VOCAB_SIZE,
                       num_cands: int = NUM_CANDS) -> list[Example]:
    """``n`` random examples of the CBT-NE shape (see module docstring). Token 0 is padding."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(10, vocab_size + 9))             # Zipf-like, ids 1..V-1
    cdf /= cdf[-1]

    def words(count: int) -> np.ndarray:
        return np.minimum(np.searchsorted(cdf, rng.random(count)), vocab_size - 2) + 1

    doc_lens = _lengths(rng, n, 430, 110, 130, 1000)
    query_lens = _lengths(rng, n, 28, 12, 3, 120)
    examples = []
    for doc_len, query_len in zip(doc_lens, query_lens):
        doc, query = words(doc_len), words(query_len)
        cands = rng.choice(np.arange(1, vocab_size), num_cands, replace=False)
        counts = rng.integers(1, 7, num_cands)
        positions = rng.choice(doc_len, counts.sum(), replace=False)
        doc_cand = np.full(doc_len, -1, dtype=np.int64)
        doc_cand[positions] = np.repeat(np.arange(num_cands), counts)
        doc[positions] = cands[doc_cand[positions]]
        examples.append(Example(doc, query, doc_cand, int(rng.integers(num_cands))))
    return examples


def collate(examples: list[Example], device: str | torch.device = "cpu") -> Batch:
    """Pad to the longest document and query of the batch (right padding, id 0)."""
    n, ld, lq = len(examples), max(len(e.doc) for e in examples), max(len(e.query) for e in examples)
    doc = torch.zeros(n, ld, dtype=torch.int64)
    query = torch.zeros(n, lq, dtype=torch.int64)
    doc_cand = torch.full((n, ld), -1, dtype=torch.int64)
    for i, e in enumerate(examples):
        doc[i, : len(e.doc)] = torch.from_numpy(e.doc)
        query[i, : len(e.query)] = torch.from_numpy(e.query)
        doc_cand[i, : len(e.doc)] = torch.from_numpy(e.doc_cand)
    doc_len = torch.tensor([len(e.doc) for e in examples])
    query_len = torch.tensor([len(e.query) for e in examples])
    batch = Batch(doc, torch.arange(ld) < doc_len.unsqueeze(1), query, torch.arange(lq) < query_len.unsqueeze(1),
                  doc_cand, torch.ones(n, NUM_CANDS, dtype=torch.bool),
                  torch.tensor([e.answer for e in examples]), [str(i) for i in range(n)],
                  doc_lengths=doc_len, query_lengths=query_len)
    return batch.to(device)


def bucketed_batches(examples: list[Example], batch_size: int, seed: int = 0) -> list[list[Example]]:
    """Sort by document length, cut into batches, shuffle the batch order."""
    ordered = sorted(examples, key=lambda e: len(e.doc))
    batches = [ordered[i: i + batch_size] for i in range(0, len(ordered), batch_size)]
    np.random.default_rng(seed).shuffle(batches)
    return batches


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(step: Callable[[Batch], object], batches: Iterable[Batch], device: str,
               clock: Callable[[], float] = time.perf_counter) -> tuple[float, int]:
    """Seconds (by ``clock``) and examples for running ``step`` over ``batches``."""
    _sync(device)
    start, count = clock(), 0
    for batch in batches:
        step(batch)
        count += len(batch)
    _sync(device)
    return clock() - start, count


def matmul_gflops(device: str = "cpu", size: int = 2048, reps: int = 10,
                  dtype: torch.dtype = torch.float32) -> float:
    """The machine's measured rate of a large ``dtype`` matmul: the roofline that the model's
    matmuls in that dtype are held to."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * size**3 * reps / (time.perf_counter() - start) / 1e9


DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")   # x86 AVX-512 BF16 and AMX; arm64's BF16 extension
NO_BF16_UNITS = ("bf16 roofline skipped: this CPU has no bf16 units (none of avx512_bf16, amx_bf16 in "
                 "/proc/cpuinfo), so bf16 matmuls are emulated and slower than fp32; matmul_gflops_bf16 is null")


def bf16_units(device: str = "cpu", features: str | None = None) -> bool:
    """Whether ``device`` multiplies bf16 in hardware: a GPU, or a CPU with one of
    :data:`BF16_CPU_FLAGS` among its ``features`` (default: this CPU's)."""
    if not device.startswith("cpu"):
        return True
    flags = (features if features is not None else precision_lib.cpu_features()).split()
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def matmul_rooflines(device: str = "cpu", size: int = 2048, rounds: int = 3,
                     bf16: bool | None = None) -> dict[str, float | None]:
    """GFLOP/s of a large (``size``²) fp32 and bf16 matmul on ``device``: the median of
    ``rounds``, the two dtypes alternating (a shared machine's load then hits both alike).
    ``bf16=False`` (default: :func:`bf16_units`) skips bf16, whose rate is then None: on a CPU
    without bf16 units it is emulated, and timing it takes minutes."""
    dtypes = {"fp32": torch.float32, **({"bf16": torch.bfloat16} if (bf16_units(device) if bf16 is None else bf16)
                                        else {})}
    rates: dict[str, list[float]] = {name: [] for name in dtypes}
    for _ in range(rounds):
        for name, dtype in dtypes.items():
            rates[name].append(matmul_gflops(device, size=size, reps=3, dtype=dtype))
    return {"bf16": None, **{name: round(sorted(r)[len(r) // 2], 1) for name, r in rates.items()}}


def count_flops(fn: Callable[[], object]) -> int:
    """Matrix-multiply FLOPs of ``fn()`` (forward and backward), by ``FlopCounterMode``: only the
    matmuls that reach the dispatcher (not cuDNN's GRU, nor the fused CPU recurrence). The
    benchmark counts with ``iaa.jobs.train.flops`` instead; this checks that formula."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def count_flops_by_dtype(fn: Callable[[], object]) -> dict[str, int]:
    """Matrix-multiply FLOPs of ``fn()`` by the dtype of the operands that each matmul multiplied
    (``FlopCounterMode``'s formulas; the first floating-point operand's dtype)."""
    from torch.utils.flop_counter import flop_registry

    from iaa.jobs.training.torch_internals import dispatch_mode, overload_packet

    flops: dict[str, int] = {}

    class ByDtype(dispatch_mode()):  # type: ignore[misc]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = flop_registry.get(overload_packet(func))
            if formula is not None:
                dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())
                name = DTYPE_NAMES.get(dtype, str(dtype))
                flops[name] = flops.get(name, 0) + int(formula(*args, **kwargs, out_val=out))
            return out

    with ByDtype():
        fn()
    return flops


def _peak_memory_bytes(device: str) -> int:
    """Peak memory so far: the CUDA caching allocator's peak, or the process's peak resident set."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024     # Linux: KiB


def _setup(model: str, overrides: dict[str, object] | None, device: str, precision: str):
    """The reader config and the precision used (fp32 | bf16) of a bench run."""
    used = precision_lib.resolve(precision, device)
    cfg: ReaderConfig = replace(PRESETS["paper"], kind=model, vocab_size=VOCAB_SIZE, **(overrides or {}))
    return cfg, used


def _time_inference(reader, device: str, batch_size: int, steps: int, warmup: int, seed: int):
    infer_pool = synthetic_examples((warmup + 2 * steps) * batch_size, seed=seed + 1)
    infer_batches = [collate(b, device) for b in bucketed_batches(infer_pool, batch_size, seed)]
    reader.eval()
    with torch.inference_mode():
        time_steps(reader, infer_batches[:warmup], device)
        return time_steps(reader, infer_batches[warmup:], device)


# The roofline's matmul by device: on a GPU 2048³ is bound by the kernel launch and reads low.
MATMUL_SIZES = {"cpu": 2048, "cuda": 8192}


def roofline_size(device: str) -> int:
    """The side of the roofline's matmul on ``device`` (:data:`MATMUL_SIZES`; the CPU's elsewhere)."""
    return MATMUL_SIZES.get(torch.device(device).type, MATMUL_SIZES["cpu"])


@dataclass(frozen=True, kw_only=True)
class BenchResult(Result):
    """``iaa-cli bench``: the workload's training and inference rates, the FLOPs of a training
    example (per example of the median-length batch) and the machine's rooflines.

    ``flops_by_dtype``: by the dtype each matmul multiplied in; ``matmul_gflops``: the roofline of
    the precision used (``matmul_gflops_bf16`` is None on a machine without bf16 units, with a
    warning); ``roofline_fraction``: the time the matmuls would take at their own dtype's roofline
    over the measured step time; ``kernels``: the fast path of each slot, or why a slot runs the
    reference (:func:`kernels_report`); ``saved``: the JSON file it was saved to, once saved.
    """

    train_examples_per_s: float
    infer_examples_per_s: float
    flops_per_train_example: int
    flops_by_dtype: dict[str, int]
    achieved_gflops: float
    matmul_gflops: float | None
    matmul_gflops_fp32: float
    matmul_gflops_bf16: float | None
    roofline_fraction: float
    peak_memory_bytes: int | None
    config: dict[str, Any]              # the ReaderConfig timed
    batch_size: int
    threads: int
    device: str
    precision: str                      # the one used
    compile: bool
    kernels: dict[str, str]
    saved: str | None = absent_when_none()


@dataclass(frozen=True)
class BenchSettings:
    """What ``--set bench.KEY=VALUE`` sets: :func:`run`'s keywords (see there), each checked."""

    batch_size: int = 32
    steps: int = 10
    warmup: int = 2
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    threads: int = 0
    compile: bool = False
    compile_backend: str = "inductor"
    matmul_size: int = 0                      # 0: the device's (MATMUL_SIZES)

    def __post_init__(self) -> None:
        for name, least in (("batch_size", 1), ("steps", 1), ("warmup", 0), ("threads", 0), ("matmul_size", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"bench.{name} must be at least {least}, got {getattr(self, name)}")

    def keywords(self) -> dict[str, Any]:
        """:func:`run`'s keywords."""
        return {**asdict(self), "matmul_size": self.matmul_size or None}


def settle(model: str, sets: Mapping[str, Any]) -> tuple[dict[str, Any], BenchSettings]:
    """The reader's overrides and the settings that ``sets`` (``--set``, parsed: ``{"model":
    {...}, "bench": {...}}``) gives a bench of ``model``, checked as ``train`` checks its config:
    an unknown key, a value of the wrong type or out of range is one :class:`ConfigError` naming
    it, before anything is timed."""
    unknown = sorted(set(sets) - {"model", "bench"})
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown}: bench takes `sets` model.KEY (the reader's fields) "
                          f"and bench.KEY ({', '.join(f.name for f in fields(BenchSettings))})")
    for section in ("model", "bench"):
        if not isinstance(sets.get(section, {}), Mapping):
            raise ConfigError(f"{section}: expected keys under it, as {section}.KEY=VALUE")
    given = dict(sets.get("model", {}))
    reader = merge(replace(PRESETS["paper"], kind=model, vocab_size=VOCAB_SIZE), given, prefix="model.")
    return {key: getattr(reader, key) for key in given}, merge(BenchSettings(), sets.get("bench", {}), prefix="bench.")


def run(model: str = "iaa", overrides: dict[str, object] | None = None, device: str = "cpu",
        batch_size: int = 32, steps: int = 10, warmup: int = 2, seed: int = 0,
        precision: str = "auto", threads: int = 0, compile: bool = False,
        compile_backend: str = "inductor", matmul_size: int | None = None) -> BenchResult:
    """Time training steps and inference after a warm-up, on the synthetic workload.

    Args:
        model: iaa | iaa-fixed-query | as-reader.
        overrides: ``ReaderConfig`` fields to change from the paper preset.
        device: cpu or cuda.
        batch_size: examples per batch (training and inference).
        steps: timed training batches (inference times 2 x steps batches).
        warmup: untimed batches first.
        seed: for the model and the workload.
        precision: fp32, bf16, or auto (``train.precision``'s rule: bf16 where this machine
            runs it at least 1.5x faster, ``iaa.jobs.modeling.precision_policy``): the reader's
            precision (bf16 operands in the CPU kernels, bf16 autocast elsewhere).
        threads: torch intra-op threads for the run (0 keeps the current setting).
        compile: ``train.compile``: compiled attention reads (CUDA graphs on CUDA) over batches
            padded to bucketed widths; every timed batch's shape is compiled before the timing.
        compile_backend: ``torch.compile``'s backend (``eager``: graph capture only, for a quick check).
        matmul_size: the square matmul that measures the machine's rate (``matmul_gflops``);
            default :data:`MATMUL_SIZES` of the device.

    Returns:
        The :class:`BenchResult`.
    """
    retain_freed_memory()                     # an entry point: opts the process in
    if threads > 0:
        torch.set_num_threads(threads)
    cfg, used = _setup(model, overrides, device, precision)
    torch.manual_seed(seed)
    reader = build_reader(cfg, device, used).to(device)
    train = partial(train_step, reader, build_optimizer(reader, LR, EMBED_L2))
    train_batches = _train_batches(device, batch_size, warmup + steps, seed)
    if compile:
        train_batches = _compile_reads(reader, train_batches, device, compile_backend)
    train_s, train_n = _time_training(train, train_batches, device, warmup, compile)
    by_dtype = _train_flops_by_dtype(cfg, used, device, train, train_batches, reader.kernels.describe())
    infer_s, infer_n = _time_inference(reader, device, batch_size, steps, warmup, seed)
    rooflines = matmul_rooflines(device, size=matmul_size or roofline_size(device))
    return BenchResult(**_report(cfg, device, used, batch_size, by_dtype, train_n / train_s, infer_n / infer_s,
                                 rooflines), compile=compile, kernels=kernels_report(reader.kernels, cfg))


def _train_batches(device: str, batch_size: int, batches: int, seed: int) -> list[Batch]:
    """``batches`` length-bucketed training batches of ``batch_size`` synthetic examples, on ``device``."""
    pool = synthetic_examples(batches * batch_size, seed=seed)
    return [collate(b, device) for b in bucketed_batches(pool, batch_size, seed)]


def _compile_reads(reader, batches: list[Batch], device: str, backend: str) -> list[Batch]:
    """Compile the reader's attention reads (CUDA graphs on CUDA); returns ``batches`` padded to bucketed widths."""
    reader.compile_reads(mode="reduce-overhead" if device.startswith("cuda") else None, backend=backend)
    return [pad_to_buckets(b) for b in batches]


def _time_training(train: Callable[[Batch], float], batches: list[Batch], device: str, warmup: int,
                   compile: bool) -> tuple[float, int]:
    """Seconds and examples of ``train`` over ``batches[warmup:]``, after an untimed warm-up.

    The warm-up runs the first ``warmup`` batches, or with ``compile`` every batch, so that each
    timed shape is compiled before the timing. CUDA's peak memory counts from the warm-up on.
    """
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    time_steps(train, batches[:warmup] if not compile else batches, device)
    return time_steps(train, batches[warmup:], device)


def _train_flops_by_dtype(cfg: ReaderConfig, used: str, device: str, train: Callable[[Batch], float],
                          batches: list[Batch], kernels: dict) -> dict[str, float]:
    """A training example's matmul FLOPs by dtype (:func:`_flops_by_dtype`), on the median-length batch.

    ``kernels`` (``reader.kernels.describe()``) tells which matmuls run in the C++ kernels on AMX.
    """
    typical = sorted(batches, key=lambda b: b.doc.shape[1])[len(batches) // 2]
    flops = batch_flops(cfg, typical) / len(typical)
    on_amx = batch_recurrent_flops(cfg, typical) / len(typical) if kernels["amx_recurrence"] else 0.0
    sizes = (2 * cfg.hidden_dim, cfg.state_dim, cfg.gate_dim)
    if kernels["amx_step_layers"] and all(size % 32 == 0 for size in sizes):
        on_amx += step_layer_flops(cfg, len(typical)) / len(typical)    # the steps' layers on AMX
    return _flops_by_dtype(flops, used, device, lambda: train(typical), len(typical), on_amx)


def kernels_report(kernels: fast.Kernels, cfg: ReaderConfig) -> dict[str, str]:
    """The kernel of each slot that has one, by name, and for a slot where a kernel declares the
    device and precision but runs the reference, why: its switch is off, or it does not cover the
    reader (``why_not``), e.g. {"encoder": "reference (PaddedGRU covers h <= 128)"}."""
    report = kernels.chosen()
    for kernel in fast.KERNELS:
        if kernel.slot in report or not kernel.support.covers(cfg, kernels.device, kernels.precision):
            continue
        if kernel.switch is not None and not getattr(cfg, kernel.switch):
            report[kernel.slot] = f"reference ({kernel.switch} is off)"
        elif (why := getattr(kernel, "why_not", lambda _: None)(cfg)) is not None:
            report[kernel.slot] = f"reference ({why})"
    return report


def _flops_by_dtype(flops: float, used: str, device: str, step: Callable[[], object], examples: int,
                    on_amx: float = 0.0) -> dict[str, float]:
    """A training example's matmul FLOPs (``flops``, all of them) by the dtype they multiply in.

    fp32 runs, and bf16 autocast on CUDA (where cuDNN's GRU runs in bf16 too), multiply all in
    one dtype. On the CPU in bf16, the matmuls with bf16 operands reach the dispatcher and are
    counted there (``count_flops_by_dtype``, one more step), except the matmuls of the C++
    kernels on AMX (the recurrence, the attention steps' layers in training), which are counted
    from the config (``on_amx``: their FLOPs per example); the rest is fp32.
    """
    if used == "fp32" or device.startswith("cuda"):
        return {used: flops}
    bf16 = min(count_flops_by_dtype(step).get("bf16", 0) / examples + on_amx, flops)
    return {"fp32": flops - bf16, "bf16": bf16}


def _report(cfg: ReaderConfig, device: str, used: str, batch_size: int, by_dtype: dict[str, float],
            train_rate: float, infer_rate: float, rooflines: dict[str, float]) -> dict[str, Any]:
    """The figures of :class:`BenchResult` but ``compile`` and ``kernels``."""
    flops = sum(by_dtype.values())                                     # per example, median-length batch
    achieved = flops * train_rate / 1e9
    # seconds per example the matmuls would take, each at its own dtype's roofline
    ideal_s = sum(f / ((rooflines.get(name) or rooflines["fp32"]) * 1e9) for name, f in by_dtype.items())
    return {
        "warnings": (NO_BF16_UNITS,) if rooflines.get("bf16") is None else (),
        "train_examples_per_s": round(train_rate, 2),
        "infer_examples_per_s": round(infer_rate, 2),
        "flops_per_train_example": int(flops),
        "flops_by_dtype": {name: int(f) for name, f in sorted(by_dtype.items())},
        "achieved_gflops": round(achieved, 3),
        "matmul_gflops": rooflines[used],
        "matmul_gflops_fp32": rooflines["fp32"],
        "matmul_gflops_bf16": rooflines["bf16"],
        "roofline_fraction": round(ideal_s * train_rate, 3),
        "peak_memory_bytes": _peak_memory_bytes(device),
        "config": asdict(cfg),
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "device": device,
        "precision": used,
    }


def save(result: BenchResult, path: Path) -> BenchResult:
    """Write ``result`` (what :func:`run` returned) as JSON to ``path``, replacing an earlier one;
    returns it with ``saved``."""
    import json

    from iaa.files import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result.fields(), indent=1, default=str) + "\n")
    return replace(result, saved=str(path.resolve()))
