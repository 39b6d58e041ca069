"""Resident memory of a long CPU training run, with the batches' widths padded to multiples and as loaded.

    python benchmarks/bench_memory.py --data PREPARED [--dataset cbt-cn] [--model as-reader]
                                      [--steps 2500] [--report-every 100] [--json OUT]

Two processes train the same reader on the same prepared data at once, one thread each, with
freed memory retained in the heap as ``iaa-cli train`` sets it (``step.retain_freed_memory``):
``padded`` pads each batch's widths to multiples, as the loop does on the CPU
(``iaa.data.loading.batch.pad_to_multiple``); ``as-loaded`` trains the batches as the loader cuts them.
Every 10 steps each reads its resident memory; every ``--report-every`` steps (100) it reports
it, its peak so far and its seconds. The two run side by side, so the seconds' ratio is the padding's cost on this machine
(the sides share the memory bus).
Checks are switched off (``train.check_every`` past the run), so both run the same steps. The
last line is JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIDES = ("padded", "as-loaded")


def resident_mb() -> int:
    """This process's resident memory, as the loop's ``resident_mb`` metric reads it."""
    return psutil.Process().memory_info().rss >> 20


def side(args: argparse.Namespace) -> None:
    """One side: train ``--steps`` steps, one JSON line every ``--report-every``."""
    from iaa.jobs.config import presets
    from iaa.jobs.config.job_config import merge
    from iaa.jobs.datasets import resolve
    from iaa.jobs.training import loop
    from iaa.jobs.training.session import LocalSession
    from iaa.jobs.training.step import retain_freed_memory

    retain_freed_memory()
    if args.side == "as-loaded":
        loop.pad_to_multiple = lambda batch: batch
    cfg = merge(presets.for_dataset(args.dataset, args.model),
                {"train": {"threads": 1, "check_every": 10**9, "max_epochs": 1000.0}})
    cfg = replace(cfg, model=replace(cfg.model, vocab_size=resolve.vocab_size(args.data)))
    with tempfile.TemporaryDirectory(prefix="iaa-bench-memory-") as run_dir:
        session = LocalSession(args.data, Path(run_dir), batch_size=cfg.train.batch_size, seed=0)
        trainer = loop.Trainer(cfg, session, show_progress=False)
        peak, start = resident_mb(), time.perf_counter()
        for step, _ in enumerate(itertools.islice(trainer.steps(), args.steps), 1):
            if step % 10 == 0:
                peak = max(peak, resident_mb())
            if step % args.report_every == 0:
                print(json.dumps({"side": args.side, "step": step, "rss_mb": resident_mb(), "peak_mb": peak,
                                  "seconds": round(time.perf_counter() - start, 1)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a folder written by iaa-cli prepare")
    parser.add_argument("--dataset", default="cbt-cn", help="the preset whose reader and batch size train")
    parser.add_argument("--model", default="as-reader")
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--report-every", type=int, default=100, help="steps between two reports of a side")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return side(args)

    base = [sys.executable, __file__, "--data", str(args.data), "--dataset", args.dataset, "--model", args.model,
            "--steps", str(args.steps), "--report-every", str(args.report_every)]
    procs = {name: subprocess.Popen([*base, "--side", name], stdout=subprocess.PIPE, text=True) for name in SIDES}
    rows = {name: [json.loads(line) for line in proc.stdout] for name, proc in procs.items()}
    for name, proc in procs.items():
        if proc.wait() != 0:
            sys.exit(f"the {name} side failed (exit {proc.returncode})")

    print(f"{args.model} at the {args.dataset} preset, one thread a side, side by side\n")
    print(f"{'step':>6} " + " ".join(f"{name + ' MB':>9} {name + ' peak':>10}" for name in SIDES))
    for padded, loaded in zip(*rows.values()):
        if padded["step"] % 500 == 0 or padded is rows["padded"][-1]:
            print(f"{padded['step']:>6} {padded['rss_mb']:>9} {padded['peak_mb']:>10} "
                  f"{loaded['rss_mb']:>9} {loaded['peak_mb']:>10}")
    last = {name: rows[name][-1] for name in SIDES}
    result = {
        "model": args.model, "dataset": args.dataset, "steps": args.steps,
        "peak_mb": {name: last[name]["peak_mb"] for name in SIDES},
        "seconds": {name: last[name]["seconds"] for name in SIDES},
        "seconds_ratio_padded_over_loaded": round(last["padded"]["seconds"] / last["as-loaded"]["seconds"], 3),
        "rows": rows,
    }
    print(f"\npeak: padded {result['peak_mb']['padded']} MB, as loaded {result['peak_mb']['as-loaded']} MB; "
          f"seconds padded / as loaded: {result['seconds_ratio_padded_over_loaded']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
