"""Inference cost of an ACT reader (``model.halting=act``) against a fixed-T reader.

Both checkpoints score the same split in the same process, batch by batch, taking turns (who
goes first alternates), so the machine's load falls on both alike; only ratios are meaningful
on a shared machine. Reported: accuracy, examples/s, the ACT reader's mean steps and their
histogram, and the same on the "easy" examples (those the ACT reader stops at in at most
``--easy-steps`` steps), batched together: a batch of easy questions is where halting pays.

    python benchmarks/bench_act.py --act RUN/checkpoints/best.pt --fixed RUN2/checkpoints/best.pt \\
        --data iaa-work/data/cbt-cn --rounds 3 --json act.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from iaa.data.loading.loader import PreparedData, iter_batches
from iaa.jobs.modeling import checkpoint


@torch.no_grad()
def timed_pass(models: dict, table, batch_size: int, rounds: int) -> dict:
    """Per model: seconds, examples, correct and the per-example steps, over ``rounds`` passes."""
    stats = {name: {"seconds": 0.0, "examples": 0, "correct": 0, "steps": []} for name in models}
    names = list(models)
    warm = next(iter_batches(table, batch_size, seed=0, epoch=0, shuffle=False))
    for model in models.values():           # untimed: builds the inference table, loads the kernels
        model(warm)
    for r in range(rounds):
        for i, batch in enumerate(iter_batches(table, batch_size, seed=0, epoch=0, shuffle=False)):
            order = names if (i + r) % 2 == 0 else names[::-1]
            for name in order:
                start = time.perf_counter()
                out = models[name](batch)
                log_p, halting = out.log_probs, out.halting
                stats[name]["seconds"] += time.perf_counter() - start
                s = stats[name]
                s["examples"] += len(batch)
                if r == 0:
                    s["correct"] += int((log_p.argmax(1) == batch.answer).sum())
                    s["steps"] += halting.steps.tolist() if halting is not None else [models[name].cfg.steps] * len(batch)
    out = {}
    for name, s in stats.items():
        n = len(s["steps"])
        out[name] = {"accuracy": s["correct"] / n, "examples_per_s": s["examples"] / s["seconds"],
                     "mean_steps": sum(s["steps"]) / n,
                     "steps_histogram": {k: s["steps"].count(k) for k in sorted(set(s["steps"]))}}
    return out, stats


def timing_arguments(ap: argparse.ArgumentParser, rounds: int) -> None:
    """The options every inference-timing script shares: data, split, batch, rounds, threads, output."""
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--split", default="valid")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="Only the split's first N examples.")
    ap.add_argument("--json", type=Path)


def split_table(args: argparse.Namespace):
    """The split to time: all of it, or its first ``--limit`` examples."""
    data = PreparedData.open(args.data)
    return data.table(args.split) if args.limit is None else data.rows(args.split, 0, args.limit)


def emit(report: dict, path: Path | None) -> None:
    """Print the report as JSON, and write it to ``path`` when one is given."""
    text = json.dumps(report, indent=1)
    print(text)
    if path:
        path.write_text(text + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--act", type=Path, required=True)
    ap.add_argument("--fixed", type=Path, required=True)
    ap.add_argument("--easy-steps", type=int, default=2)
    timing_arguments(ap, rounds=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {"act": checkpoint.load_model(args.act)[0], "fixed": checkpoint.load_model(args.fixed)[0]}
    table = split_table(args)
    result, stats = timed_pass(models, table, args.batch_size, args.rounds)
    order = [row for b in iter_batches(table, args.batch_size, seed=0, epoch=0, shuffle=False)
             for row in b.example_ids]
    easy_ids = {e for e, n in zip(order, stats["act"]["steps"]) if n <= args.easy_steps}
    easy = table.filter(torch.tensor([e in easy_ids for e in table.column("example_id").to_pylist()]).numpy())
    report = {"split": args.split, "examples": table.num_rows, "batch_size": args.batch_size, "rounds": args.rounds,
              "threads": args.threads, "all": result,
              "speedup_all": result["act"]["examples_per_s"] / result["fixed"]["examples_per_s"]}
    if easy.num_rows:
        easy_result, _ = timed_pass(models, easy, args.batch_size, args.rounds)
        report.update(easy_examples=easy.num_rows, easy_steps=args.easy_steps, easy=easy_result,
                      speedup_easy=easy_result["act"]["examples_per_s"] / easy_result["fixed"]["examples_per_s"])
    emit(report, args.json)


if __name__ == "__main__":
    main()
