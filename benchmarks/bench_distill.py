"""Inference cost of distilled students against the ensemble they were distilled from.

Every checkpoint scores the same split in the same process, batch by batch, taking turns (see
``bench_act.timed_pass``), so the machine's load falls on all alike. The ensemble's cost per
example is the sum of its members' (it runs each member once), so its examples/s is
1 / Σ_m (1 / ex/s_m).

    python benchmarks/bench_distill.py --data iaa-work/data/cbt-cn --members RUN{0..4}/checkpoints/best.pt \\
        --student full=STUDENT/checkpoints/best.pt --student half=HALF/checkpoints/best.pt --json cost.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_act import emit, split_table, timed_pass, timing_arguments  # noqa: E402

from iaa.jobs.modeling import checkpoint  # noqa: E402


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=Path, nargs="+", required=True)
    ap.add_argument("--student", action="append", default=[], metavar="NAME=CKPT")
    timing_arguments(ap, rounds=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {f"member{i}": checkpoint.load_model(p)[0] for i, p in enumerate(args.members)}
    for spec in args.student:
        name, _, path = spec.partition("=")
        models[name] = checkpoint.load_model(Path(path))[0]
    table = split_table(args)
    result, _ = timed_pass(models, table, args.batch_size, args.rounds)
    for name, model in models.items():
        result[name]["parameters"] = parameters(model)
    members = [result[f"member{i}"] for i in range(len(args.members))]
    ensemble_per_s = 1.0 / sum(1.0 / m["examples_per_s"] for m in members)
    report = {"split": args.split, "examples": table.num_rows, "rounds": args.rounds, "threads": args.threads,
              "models": result, "ensemble_examples_per_s": ensemble_per_s,
              "ensemble_parameters": sum(m["parameters"] for m in members),
              "speedup_over_ensemble": {name: result[name]["examples_per_s"] / ensemble_per_s
                                        for name in models if not name.startswith("member")}}
    emit(report, args.json)


if __name__ == "__main__":
    main()
