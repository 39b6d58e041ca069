"""The C++ kernels (CPU), built on first use: the GRU recurrence of ``fused_gru`` and the IAA
reader's T inference steps (``inference_steps``).

Why: at batch 32 each recurrent step is a (32 x 128) x (128 x 384) matmul plus element-wise gate
arithmetic on ~8,000 numbers. From Python that is ~7 operator calls per step forward and ~15
backward, each costing more in dispatch than in arithmetic (~130 µs and ~200 µs per step). Here
the gate arithmetic of a step is one plain loop (sigmoid and tanh stay ATen's vectorised
kernels), and the loop over steps runs in C++: ~35 µs per step. Same formulas as the Python loop
in ``fused_gru``, which stays as the fallback and the reference in the tests.

The sources lie beside this file: ``gru_kernels.cpp`` (the generic loops and their AVX-512
versions, chosen at run time) and ``gru_amx.cpp`` (the AMX products, its own translation unit).
A compiler without AMX support (GCC before 11) cannot build ``gru_amx.cpp``: the rest is then
built alone, with ``-DIAA_NO_AMX``, and runs without AMX. They are built with
``torch.utils.cpp_extension.load`` (needs a C++ compiler and ninja) into ``$TORCH_EXTENSIONS_DIR``
(default ``~/.cache/torch_extensions``); the first build on a machine takes ~30 s. The build's
name carries a hash of the sources, the compiler flags, the torch version and the machine type,
so a changed source or flag never loads a stale build.

The build is keyed by that content alone, never by where this file lies: the sources are copied
into the build's folder and compiled there, and a folder that already holds the built library
is loaded directly. An MLflow model unpacks this package into a new temporary folder on every
load; it still reuses the build of any earlier load, of any copy of the same sources.

It is built for the generic target of the machine type (x86-64, arm64), not ``-march=native``:
native code can hold instructions that another CPU lacks, and nodes of a cluster that share a
cache folder would load each other's builds. Native code was measured 0 to 1.4% faster on the
BiGRU and 0.4 to 0.5% on a training step (``benchmarks/bench_changes.py --only march/``,
benchmarks/HISTORY.md), which is not worth that risk. A build with native flags (the benchmark's)
is also keyed by the CPU's instruction-set extensions.

For debugging, ``IAA_NO_COMPILED_KERNELS=1`` skips the build (the Python loops run); a failed
build warns once and does the same.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sys
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("gru_kernels.cpp")
AMX_SOURCE = SOURCE.with_name("gru_amx.cpp")
HEADERS = (SOURCE.with_name("gru_amx.h"),)
CFLAGS = ("-O3", "-fopenmp")
NO_AMX = "-DIAA_NO_AMX"                                        # the build without gru_amx.cpp
NATIVE = ("-march=native", "-mcpu=native", "-mtune=native")   # flags that make a build CPU-specific
LDFLAGS = ("-fopenmp",)
DISABLE = "IAA_NO_COMPILED_KERNELS"

_STATE: dict[str, ModuleType | None] = {}


def cpu_features() -> str:
    """The CPU's instruction-set extensions: the ``flags`` line of ``/proc/cpuinfo`` (Linux),
    else the machine and processor names."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith(("flags", "Features")):                # x86, arm64
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _sources(cflags: tuple[str, ...]) -> tuple[Path, ...]:
    """The files compiled with ``cflags``: without ``gru_amx.cpp`` in the build without AMX."""
    return (SOURCE,) if NO_AMX in cflags else (SOURCE, AMX_SOURCE)


def build_name(cflags: tuple[str, ...] = CFLAGS) -> str:
    """The extension's name (and cache folder): one per sources, flags, torch version, Python
    version and machine type, and with native flags one per set of CPU features too."""
    import torch

    cpu = cpu_features() if any(flag in NATIVE for flag in cflags) else platform.machine()
    key = hashlib.sha256()
    for part in (*(path.read_bytes() for path in (*_sources(cflags), *HEADERS)), " ".join(cflags).encode(),
                 " ".join(LDFLAGS).encode(), torch.__version__.encode(), cpu.encode(),
                 sys.implementation.cache_tag.encode()):
        key.update(part)
        key.update(b"\0")
    return f"iaa_gru_kernels_{key.hexdigest()[:16]}"


def _build_folder(cflags: tuple[str, ...]) -> tuple[str, Path]:
    """The build's name and folder: under ``TORCH_EXTENSIONS_DIR``, else torch's default build root,
    one folder per Python ABI (the name already holds torch's version and the flags)."""
    from torch.utils.cpp_extension import get_default_build_root

    name = build_name(cflags)
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return name, Path(root) / f"iaa-{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}" / name


def load_built(cflags: tuple[str, ...] = CFLAGS) -> ModuleType | None:
    """The build for ``cflags`` where it already exists, else None (compiles nothing)."""
    name, folder = _build_folder(cflags)
    library = folder / f"{name}{'.pyd' if os.name == 'nt' else '.so'}"
    spec = importlib.util.spec_from_file_location(name, library) if library.is_file() else None
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (ImportError, OSError):   # half written, or built for another machine
        return None
    return module


def build(cflags: tuple[str, ...] = CFLAGS) -> ModuleType:
    """Load the built kernels for ``cflags``, compiling them first when no build exists."""
    from torch.utils.cpp_extension import load as load_extension

    module = load_built(cflags)
    if module is not None:
        return module
    name, folder = _build_folder(cflags)                 # build under torch's lock
    folder.mkdir(parents=True, exist_ok=True)
    for path in (*_sources(cflags), *HEADERS):
        copy = folder / path.name
        if not copy.is_file() or copy.read_bytes() != path.read_bytes():
            staged = folder / f".{path.name}.{os.getpid()}"
            staged.write_bytes(path.read_bytes())
            staged.replace(copy)
    return load_extension(name=name, sources=[str(folder / path.name) for path in _sources(cflags)],
                          extra_cflags=list(cflags), extra_ldflags=list(LDFLAGS), build_directory=str(folder),
                          verbose=False)


def build_with_fallback(cflags: tuple[str, ...] = CFLAGS) -> ModuleType:
    """The kernels with AMX, or without it where ``gru_amx.cpp`` does not compile here.

    A build without AMX exists only where the build with it failed before, so it is loaded
    before compiling anything: a compiler without AMX support tries the AMX build once.
    """
    without = (*cflags, NO_AMX)
    module = load_built(cflags) or load_built(without)
    if module is not None:
        return module
    try:
        return build(cflags)
    except Exception as error:  # noqa: BLE001 - e.g. GCC before 11 does not know amx-tile: build the rest
        warnings.warn(f"iaa: the AMX kernels do not compile here, building the others without them ({error})")
        return build(without)


def load() -> ModuleType | None:
    """The compiled kernels, or None when disabled (``IAA_NO_COMPILED_KERNELS=1``) or the build
    failed."""
    if "module" in _STATE:
        return _STATE["module"]
    module = None
    if os.environ.get(DISABLE, "0") in ("", "0"):
        try:
            module = build_with_fallback()
        except Exception as error:  # noqa: BLE001 - no compiler or ninja: the Python loop computes the same
            warnings.warn(f"iaa: C++ kernels unavailable, using the Python loops ({error})")
    _STATE["module"] = module
    return module
