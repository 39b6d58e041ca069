"""``train.precision``: fp32, bf16, or auto, which picks bf16 where this machine runs it faster.

The resolved precision is an argument of the reader (``iaa.model.build_reader``): bf16 gives its
matmuls bf16 operands (on the CPU through its kernels, ``iaa.model.kernels``, elsewhere through
bf16 autocast). Parameters, gradients, Adam's state, the softmaxes, the pointer-sum and the loss
stay fp32 either way.

``auto`` on a CPU times bf16 against fp32 on an encoder-shaped GEMM (a few hundred milliseconds)
and uses bf16 where it is at least ``BF16_MIN_SPEEDUP`` times faster: CPUs with AMX or
AVX512-BF16. Elsewhere bf16 is emulated, slower than fp32, and ``auto`` keeps fp32, the same code
as ``precision=fp32``. The result is cached per machine (CPU model and flags, torch version,
threads) in ``$IAA_CACHE_DIR`` (default ``$XDG_CACHE_HOME/iaa``, i.e. ``~/.cache/iaa``), so the
probe runs once per machine. On CUDA, ``auto`` is bf16 where the GPU supports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping

import torch

from iaa.files import atomic_write_text
from iaa.jobs.config.job_config import ConfigError, JobConfig
from iaa.model.kernels import cpu_features

PRECISIONS = ("auto", "fp32", "bf16")
BF16_MIN_SPEEDUP = 1.5
PROBE_SHAPE = (4096, 384, 768)      # (tokens, d, 2 directions x 3h): the encoders' input projection
PROBE_REPS = 5
CACHE_FILE = "precision-probe.json"

Rates = Mapping[str, float]         # GFLOP/s by dtype name: {"fp32": ..., "bf16": ...}


def cache_dir() -> Path:
    """Where the probe's results are kept: ``$IAA_CACHE_DIR``, else ``$XDG_CACHE_HOME/iaa``."""
    if os.environ.get("IAA_CACHE_DIR"):
        return Path(os.environ["IAA_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "iaa"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the processor name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """One key per CPU model and instruction-set flags, torch version and thread count."""
    parts = (cpu_name(), cpu_features(), torch.__version__, str(torch.get_num_threads()))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def measure_gemm_rates(shape: tuple[int, int, int] = PROBE_SHAPE, reps: int = PROBE_REPS) -> dict[str, float]:
    """GFLOP/s of an fp32 and a bf16 CPU matmul of ``shape`` (m, k, n): median of ``reps``
    timings, the two dtypes alternating so that a load from other processes hits both alike."""
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    operands = {"fp32": (torch.randn(m, k, generator=g), torch.randn(k, n, generator=g))}
    operands["bf16"] = tuple(t.to(torch.bfloat16) for t in operands["fp32"])
    times: dict[str, list[float]] = {name: [] for name in operands}
    for rep in range(reps + 1):                                  # the first round warms up
        for name, (a, b) in operands.items():
            start = time.perf_counter()
            torch.mm(a, b)
            if rep:
                times[name].append(time.perf_counter() - start)
    return {name: round(2 * m * k * n / statistics.median(t) / 1e9, 1) for name, t in times.items()}


def probed_rates(measure: Callable[[], Rates] = measure_gemm_rates, directory: Path | None = None) -> dict[str, float]:
    """This machine's fp32 and bf16 GEMM rates: from the cache, else measured and cached.

    An unreadable cache file is measured again and replaced; a cache folder that cannot be
    written only costs the probe on the next run.
    """
    path = (directory or cache_dir()) / CACHE_FILE
    key = machine_key()
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(cached, dict):
            cached = {}
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key)
    if isinstance(entry, dict) and all(isinstance(entry.get(d), (int, float)) for d in ("fp32", "bf16")):
        return {"fp32": float(entry["fp32"]), "bf16": float(entry["bf16"])}
    rates = {name: float(rate) for name, rate in measure().items()}
    cached[key] = {**rates, "cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    try:
        atomic_write_text(path, json.dumps(cached, indent=1, sort_keys=True))
    except OSError:
        pass
    return rates


def choose(rates: Rates) -> str:
    """bf16 where its GEMM rate is at least ``BF16_MIN_SPEEDUP`` times fp32's, else fp32."""
    return "bf16" if rates["bf16"] >= BF16_MIN_SPEEDUP * rates["fp32"] else "fp32"


def resolve(precision: str, device: str | torch.device = "cpu", rates: Callable[[], Rates] | None = None) -> str:
    """The precision a run uses: ``fp32`` or ``bf16`` as given, or ``auto`` decided for ``device``.

    Args:
        precision: auto | fp32 | bf16.
        device: where the reader runs (cpu, cuda, cuda:1).
        rates: this machine's CPU GEMM rates by dtype; default ``probed_rates`` (measured once
            per machine, then cached).
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision
    if torch.device(device).type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return choose((rates or probed_rates)())


def resolved(cfg: JobConfig, device: str | torch.device = "cpu") -> JobConfig:
    """``cfg`` with ``train.precision`` resolved for ``device``: what a run records and uses."""
    return replace(cfg, train=replace(cfg.train, precision=resolve(cfg.train.precision, device)))


def resolved_once(cfg: JobConfig, gpus: bool) -> JobConfig:
    """``cfg`` with ``auto`` decided in this process, once for all the workers or trials of a job
    (so that they compare at one precision), where this process can decide it: for CPUs by this
    machine's probe (a cluster's CPU nodes are taken to be of its kind), for GPUs where this
    process sees one. A driver without a GPU (a CPU head node of a GPU cluster) leaves ``auto``
    to the workers: each decides on its own card, which gives one answer for one kind of card,
    and the run's ``precision`` tag says what it used."""
    if gpus and cfg.train.precision == "auto" and not torch.cuda.is_available():
        return cfg
    return resolved(cfg, "cuda" if gpus else "cpu")
