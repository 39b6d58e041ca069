"""Each configuration's training cost per example, measured side by side: the price a replayed
sweep pays for a configuration's examples when its compute is counted in CPU time.

    python benchmarks/search/price.py --table benchmarks/search/curves-cbt-cn.parquet \\
        --data /tmp/cbt-work/data/cbt-cn [--rounds 5] [--batches 4]

A table's examples are the exact measure of a trial's work, but not of its cost: T 4, d 96 and
h 64 cost more per example than T 1, d 48 and h 32. The table's own ``seconds`` say by how much
only roughly: each configuration was timed in its own minutes, beside whatever else ran then.
Here every configuration of the table's grid, with the table's settings (its dataset's preset,
then the metadata's ``fixed``), trains the same batches in the same rounds: in each of
``--rounds`` rounds, each configuration in a shuffled order is built (seeded), takes one
warm-up step, then ``--batches`` timed training steps on that round's batches of the table's
training data (the first rows, batched as the training loop batches them), with one torch thread,
timed by the process's CPU time (which other processes on a shared machine barely disturb). A
configuration's price is its CPU seconds per example over all rounds: every configuration trains
exactly the same examples.

Writes ``STEM.price.json`` beside the table (``--out`` elsewhere): the settings, the machine, and
per configuration its ``config_id``, values, ``seconds_per_example`` and each round's rate.
:func:`load` reads it back as each configuration's price relative to the grid's mean.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import table as curves_table  # noqa: E402  (this folder's schema and reader)

MATCH = ("dataset", "fixed", "vocab_hash")     # metadata a price file must share with its table


def path_for(table_path: Path) -> Path:
    """Where the prices of the table at ``table_path`` are kept: ``STEM.price.json`` beside it."""
    return table_path.with_name(f"{table_path.stem}.price.json")


def measure(table: curves_table.CurveTable, data: Path, rounds: int, batches: int,
            seed: int = 0) -> list[dict[str, Any]]:
    """Per configuration of ``table`` (in config id order): its values, ``seconds_per_example`` and
    ``round_rates`` (CPU seconds per example of each round), from ``rounds`` rounds of
    ``batches`` training steps on the data prepared at ``data``."""
    import torch

    from iaa.data.loading.loader import PreparedData, iter_batches
    from iaa.jobs.config.job_config import apply
    from iaa.jobs.datasets.resolve import job_config
    from iaa.jobs.training.step import build_optimizer, train_step
    from iaa.model.reader import build_reader

    if "train.batch_size" in table.grid:
        raise SystemExit("price.py times every configuration on the same batches; this grid searches "
                         "train.batch_size")
    torch.set_num_threads(1)
    fixed = json.loads(table.metadata.get("fixed", "{}"))
    base = job_config(table.metadata.get("dataset", "demo"), data)
    keys = sorted(table.config_ids, key=table.config_ids.get)
    configs = {key: apply(base, {**fixed, **dict(zip(table.grid, _typed(table, key)))}) for key in keys}
    batch_size = base.train.batch_size
    rows = PreparedData.open(data).rows("train", 0, batch_size * batches * (rounds + 1))
    plan = list(iter_batches(rows, batch_size, seed=0, epoch=0))
    warm, timed = plan[0], plan[1:]
    spent = {key: [] for key in keys}
    order = list(keys)
    shuffle = random.Random(seed)
    for r in range(rounds):
        shuffle.shuffle(order)
        work = timed[r * batches:(r + 1) * batches]
        examples = sum(len(b) for b in work)
        for key in order:
            cfg = configs[key]
            torch.manual_seed(0)
            model = build_reader(cfg.model)
            optimizer = build_optimizer(model, cfg.train.lr, cfg.train.embed_l2)
            train_step(model, optimizer, warm, clip=cfg.train.clip)
            start = time.process_time()
            for batch in work:
                train_step(model, optimizer, batch, clip=cfg.train.clip)
            spent[key].append((time.process_time() - start) / examples)
        print(f"round {r + 1}/{rounds}: {len(order)} configurations, {examples} examples each", flush=True)
    return [{"config_id": table.config_ids[key], **dict(zip(table.grid, _typed(table, key))),
             "seconds_per_example": sum(spent[key]) / rounds, "round_rates": spent[key]} for key in keys]


def _typed(table: curves_table.CurveTable, key: curves_table.Key) -> list[Any]:
    """``key``'s values as the grid spells them (an int knob stays an int)."""
    return [next(c for c in choices if curves_table.normalise(c) == v) for choices, v in zip(table.grid.values(), key)]


def load(path: Path, table: curves_table.CurveTable) -> dict[curves_table.Key, float]:
    """Each configuration's price relative to the grid's mean (the mean is 1), from the price file at
    ``path``; SystemExit, one line, when there is none or it was measured for another table."""
    if not path.is_file():
        raise SystemExit(f"{path}: no prices there; measure them with python benchmarks/search/price.py "
                         "--table TABLE --data PREPARED (benchmarks/search/README.md)")
    record = json.loads(path.read_text(encoding="utf-8"))
    differs = [k for k in MATCH if record.get("table_metadata", {}).get(k) != table.metadata.get(k)]
    if differs or record.get("grid") != table.grid:
        raise SystemExit(f"{path}: measured for another table ({', '.join(differs) or 'grid'} differ); "
                         "measure again with python benchmarks/search/price.py")
    by_id = {row["config_id"]: row["seconds_per_example"] for row in record["configurations"]}
    missing = [i for i in table.config_ids.values() if i not in by_id]
    if missing:
        raise SystemExit(f"{path}: no price for configurations {missing[:5]}; measure again")
    mean = sum(by_id[i] for i in table.config_ids.values()) / len(table.config_ids)
    return {key: by_id[i] / mean for key, i in table.config_ids.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, default=curves_table.DEFAULT, help="the curve table [%(default)s]")
    ap.add_argument("--data", type=Path, required=True, help="the prepared folder the table was trained on")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each builds and times every configuration [5]")
    ap.add_argument("--batches", type=int, default=4, help="timed training batches per configuration and round [4]")
    ap.add_argument("--out", type=Path, default=None, help="the price file [STEM.price.json beside the table]")
    args = ap.parse_args(argv)
    import torch

    from build_table import cpu_model, git_commit

    from iaa.data.loading.loader import PreparedData

    table = curves_table.load(args.table)
    vocab_hash = PreparedData.open(args.data).manifest.vocab_hash
    if vocab_hash != table.metadata.get("vocab_hash", vocab_hash):
        raise SystemExit(f"{args.data}: not the data of {args.table} (vocabulary {vocab_hash[:12]}, the table's "
                         f"{table.metadata['vocab_hash'][:12]})")
    started = time.time()
    rows = measure(table, args.data, args.rounds, args.batches)
    out = args.out or path_for(args.table)
    record = {
        "command": shlex.join(["python", "benchmarks/search/price.py", *(argv if argv is not None else sys.argv[1:])]),
        "table": args.table.name, "table_metadata": {k: table.metadata.get(k) for k in MATCH}, "grid": table.grid,
        "rounds": args.rounds, "batches_per_round": args.batches, "clock": "process CPU time", "torch_threads": 1,
        "cpu": cpu_model(), "torch": torch.__version__, "python": platform.python_version(),
        "iaa_commit": git_commit(), "seconds": round(time.time() - started, 1),
        "date": datetime.date.today().isoformat(), "configurations": rows,
    }
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    rates = sorted(r["seconds_per_example"] for r in rows)
    print(f"{out}: {len(rows)} configurations, {1e3 * rates[0]:.2f} to {1e3 * rates[-1]:.2f} ms per example "
          f"(max / min {rates[-1] / rates[0]:.2f}), {record['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
