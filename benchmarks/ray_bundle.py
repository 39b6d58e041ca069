"""Build the slimmed Ray that travels to the GPU machine, whose Python has no Ray, Optuna or MLflow:

    python benchmarks/ray_bundle.py                       # device-ray/site-cp312.tar.xz, for Python 3.12
    python benchmarks/ray_bundle.py --python-version 3.11 # the same for this machine's Python (to try it here)

pip resolves the project's pinned Ray (with the extras the project installs, less Serve and Data)
and Optuna as manylinux wheels for that Python; every package of that closure but those taken
from the GPU machine's image (``THERE``) is installed into a staging folder with pip's
``--target``; then the script drops what Ray Tune and Ray Train never load (``DROPPED``: the
Java workers, the dashboard's built client (its page stays), RLlib, Serve, the LLM libraries,
source maps and console scripts) and packs the rest as one xz tarball.
``benchmarks/device_run.py --part 3`` (the ``ray_card`` step) unpacks it into a temporary folder,
puts that first on ``PYTHONPATH`` and reports any requirement of the unpacked packages that the
machine does not meet.

MLflow does not travel (with its server, UI and SQL store it would not fit one call): on the card,
the step tracks into the tracking port's in-memory fake, and its summary says so.

Needs pip and the package registry; writes ``OUT/site-cpXY.tar.xz`` and ``OUT/site-cpXY.json`` (the
versions, what was dropped, sizes), and removes a bundle of another Python from ``OUT`` (all of
``OUT`` travels, and two bundles do not fit one call). ``OUT`` (default ``device-ray/``) is
ignored by git.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINNED = ("ray", "optuna")   # taken at the project's pins (pyproject.toml)
EXTRAS = {"ray": "default,tune,train"}   # as the project installs Ray, less serve and data
# The packages of that closure taken from the GPU machine's image (its package list has them): the
# large ones the project itself needs there, and those that Ray's closure bounds loosely. The rest
# of the closure travels, also where the image has a copy: its versions are not known here, and
# Ray's closure asks recent ones of several (typing-extensions >= 4.16, protobuf >= 6.33,
# packaging >= 26.3, aiohttp >= 3.14, requests >= 2.33), which the step's processes then find first.
THERE = ("numpy", "pandas", "pyarrow", "python-dateutil", "pyyaml", "click", "tqdm", "fsspec", "msgpack", "six",
         "certifi", "idna", "charset-normalizer", "urllib3", "grpcio", "attrs", "markupsafe", "wrapt",
         "prometheus-client")
DROPPED = ("bin", "ray/jars", "ray/dashboard/client/build/static", "ray/dashboard/client/build/speedscope-1.5.3",
           "ray/rllib", "ray/serve", "ray/llm", "ray/tests")
KEPT_EMPTY = ("ray/dashboard/client/build/static",)   # the dashboard's head serves this folder: it must exist
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")


def pins(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``{name: version}`` of ``PINNED`` as pyproject.toml pins them (``name[extras]==version``)."""
    text = pyproject.read_text(encoding="utf-8")
    found = {}
    for name in PINNED:
        match = re.search(rf'"{name}(?:\[[^\]]*\])?==([^";\s]+)', text)
        if not match:
            raise SystemExit(f"Error: {pyproject}: no pinned {name}==VERSION among the dependencies")
        found[name] = match.group(1)
    return found


def site_name(python_version: str) -> str:
    return f"site-cp{python_version.replace('.', '')}.tar.xz"


def _platform_flags(python_version: str) -> list[str]:
    return ["--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
            *(flag for p in PLATFORMS for flag in ("--platform", p))]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_there(python_version: str) -> list[str]:
    """``name==version`` of every package of the pinned Ray's and Optuna's closure for
    ``python_version`` (as pip resolves it) that is not in ``THERE``."""
    wanted = [f"{name}[{EXTRAS[name]}]=={version}" if name in EXTRAS else f"{name}=={version}"
              for name, version in pins().items()]
    with tempfile.TemporaryDirectory(prefix="iaa-ray-resolve-") as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), "--target", str(Path(scratch) / "unused"),
                        *_platform_flags(python_version), *wanted], check=True)
        resolved = json.loads(report.read_text(encoding="utf-8"))["install"]
    there = {_canonical(name) for name in THERE}
    return sorted(f"{item['metadata']['name']}=={item['metadata']['version']}" for item in resolved
                  if _canonical(item["metadata"]["name"]) not in there)


def stage(python_version: str, target: Path) -> list[str]:
    """Install what the GPU machine lacks, for ``python_version``, into ``target``; the requirements."""
    wanted = missing_there(python_version)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                    *_platform_flags(python_version), "--target", str(target), *wanted], check=True)
    return wanted


def slim(site: Path) -> dict[str, int]:
    """Remove ``DROPPED`` and source maps from ``site``; bytes freed per path."""
    freed = {}
    for rel in DROPPED:
        path = site / rel
        if path.exists():
            freed[rel] = _size(path)
            shutil.rmtree(path)
    maps = list(site.glob("ray/**/*.map"))
    freed["ray/**/*.map"] = sum(p.stat().st_size for p in maps)
    for path in maps:
        path.unlink()
    for rel in KEPT_EMPTY:
        (site / rel).mkdir(parents=True, exist_ok=True)
    return freed


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def pack(site: Path, archive: Path) -> None:
    """``site``'s contents as one xz tarball (written aside, then renamed)."""
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")   # another build's is its own
    with lzma.open(partial, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for path in sorted(site.iterdir()):
            tar.add(path, arcname=path.name)
    partial.replace(archive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--out", type=Path, default=ROOT / "device-ray",
                        help="where the bundle goes (default device-ray/)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    archive = args.out / site_name(args.python_version)
    with tempfile.TemporaryDirectory(prefix="iaa-ray-bundle-") as scratch:
        site = Path(scratch) / "site"
        wanted = stage(args.python_version, site)
        installed = _size(site)
        freed = slim(site)
        kept = _size(site)
        pack(site, archive)
    for other in args.out.glob("site-cp*.tar.xz"):      # one bundle per folder: all of it travels
        if other != archive:
            other.unlink()
            other.with_suffix("").with_suffix(".json").unlink(missing_ok=True)
    record = {"python_version": args.python_version, "archive": archive.name, "requirements": wanted,
              "installed_bytes": installed, "dropped_bytes": freed, "unpacked_bytes": kept,
              "archive_bytes": archive.stat().st_size, "seconds": round(time.monotonic() - started, 1)}
    summary = args.out / archive.name.replace(".tar.xz", ".json")
    summary.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"{archive}: {record['archive_bytes'] / 2**20:.1f} MiB packed, {kept / 2**20:.0f} MiB unpacked "
          f"(installed {installed / 2**20:.0f} MiB, dropped {sum(freed.values()) / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
