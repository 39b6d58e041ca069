"""The GRU recurrence of ``fused_gru`` as a small C++ loop (CPU), built on first use; the same
extension also runs the IAA reader's T inference steps (``inference_steps``).

Why: at batch 32 each recurrent step is a (32 x 128) x (128 x 384) matmul plus element-wise gate
arithmetic on ~8,000 numbers. From Python that is ~7 operator calls per step forward and ~15
backward, each costing more in dispatch than in arithmetic (~130 µs and ~200 µs per step). Here
the gate arithmetic of a step is one plain loop (sigmoid and tanh stay ATen's vectorised
kernels), and the loop over steps runs in C++: ~35 µs per step. Same formulas as the Python loop
in ``fused_gru``, which stays as the fallback and the reference in the tests.

The source is ``gru_kernels.cpp`` beside this file. It is built on first use with
``torch.utils.cpp_extension.load`` (needs a C++ compiler and ninja) into
``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``); the first call on a machine
takes ~30 s. The build's name carries a hash of the source, the compiler flags, the torch version
and the machine type, so a changed source or flag never loads a stale build.

The build is keyed by that content alone, never by where this file lies: the source is copied
into the build's folder and compiled there, and a folder that already holds the built library
is loaded directly. An MLflow model unpacks this package into a new temporary folder on every
load; it still reuses the build of any earlier load, of any copy of the same source.

It is built for the generic target of the machine type (x86-64, arm64), not ``-march=native``:
native code can hold instructions that another CPU lacks, and nodes of a cluster that share a
cache folder would load each other's builds. Native code was measured 0 to 1.4% faster on the
BiGRU and 0.4 to 0.5% on a training step (``benchmarks/bench_changes.py --only march/``,
benchmarks/README.md), which is not worth that risk. A build with native flags (the benchmark's)
is also keyed by the CPU's instruction-set extensions.

Set ``IAA_GRU_CPP=0`` to skip it; a failed build warns once and the Python loop is used.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("gru_kernels.cpp")
CFLAGS = ("-O3", "-fopenmp")
NATIVE = ("-march=native", "-mcpu=native", "-mtune=native")   # flags that make a build CPU-specific
LDFLAGS = ("-fopenmp",)

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


def build_name(cflags: tuple[str, ...] = CFLAGS) -> str:
    """The extension's name (and cache folder): one per source, flags, torch version, Python
    version and machine type, and with native flags one per set of CPU features too."""
    import torch

    cpu = cpu_features() if any(flag in NATIVE for flag in cflags) else platform.machine()
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(cflags).encode(), " ".join(LDFLAGS).encode(),
                 torch.__version__.encode(), cpu.encode(), sys.implementation.cache_tag.encode()):
        key.update(part)
        key.update(b"\0")
    return f"iaa_gru_kernels_{key.hexdigest()[:16]}"


def build(cflags: tuple[str, ...] = CFLAGS) -> ModuleType:
    """Load the built kernels for ``cflags``, compiling them first when no build exists."""
    from torch.utils.cpp_extension import _get_build_directory, _import_module_from_library
    from torch.utils.cpp_extension import load as load_extension

    name = build_name(cflags)
    folder = Path(_get_build_directory(name, verbose=False))
    try:
        return _import_module_from_library(name, str(folder), True)
    except (ImportError, OSError, AssertionError):   # not built yet (or half written): build under torch's lock
        pass
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / SOURCE.name
    if not source.is_file() or source.read_bytes() != SOURCE.read_bytes():
        staged = folder / f".{SOURCE.name}.{os.getpid()}"
        staged.write_bytes(SOURCE.read_bytes())
        staged.replace(source)
    return load_extension(name=name, sources=[str(source)], extra_cflags=list(cflags),
                          extra_ldflags=list(LDFLAGS), build_directory=str(folder), verbose=False)


def load() -> ModuleType | None:
    """The compiled kernels, or None when disabled (``IAA_GRU_CPP=0``) or the build failed."""
    if "module" in _STATE:
        return _STATE["module"]
    module = None
    if os.environ.get("IAA_GRU_CPP", "1") != "0":
        try:
            module = build()
        except Exception as error:  # no compiler or ninja: the Python loop computes the same
            warnings.warn(f"iaa: C++ GRU kernels unavailable, using the Python loop ({error})")
    _STATE["module"] = module
    return module
