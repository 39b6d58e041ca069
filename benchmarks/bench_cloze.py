"""Tagging throughput of make-cloze: in this process on one core, and on Ray with N actors.

    python benchmarks/bench_cloze.py --source ../shared/data/cbt-recon/books/train_books.txt.gz \
        --tokens 600000 --style cbt-ne --ray 1,2

Takes the first books of the source until ``--tokens`` tokens, tags them once in this process
(no Ray) and once per Ray actor count, checks that every run gives the same tagging, and prints
tokens per second (wall clock, and CPU time of the in-process run), the questions those books
make, and the load average around each run. Ray's start-up is timed apart from the runs: on a shared machine the load decides the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from iaa.data.cloze import cbt_recipe, cnn_recipe
from iaa.data.cloze.sources import SourceSpec, read_documents
from iaa.data.cloze.tagging import spacy_factory
from iaa.jobs.own_data import make_cloze


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--tokens", type=int, default=600_000, help="take whole books until this many tokens")
    ap.add_argument("--style", default="cbt-ne", choices=make_cloze.STYLES)
    ap.add_argument("--ray", default="1,2", help="Ray actor counts to run, comma-separated ('' for none)")
    ap.add_argument("--no-local", action="store_true", help="skip the in-process run")
    args = ap.parse_args()

    docs, total = [], 0
    all_docs = read_documents([SourceSpec.parse(args.source)])
    for d in all_docs:
        if total >= args.tokens:
            break
        docs.append(d)
        total += sum(len(p.split()) for p in d.pieces)
    cfg = make_cloze.ClozeConfig(args.style, ())
    factory = spacy_factory(cfg.pipeline, needs=make_cloze.NEEDS[args.style])
    runs = [("local", 0)] * (not args.no_local) + [(f"ray-{n}", int(n)) for n in args.ray.split(",") if n]
    results, reference = [], None
    for name, workers in runs:
        if workers:  # start Ray outside the timed part; its start-up is reported on its own
            from iaa.platform.cluster.connect import connect

            started = time.perf_counter()
            connect(os.environ.get("RAY_ADDRESS") or "local")
            print(json.dumps({"ray_start_s": round(time.perf_counter() - started, 1)}), flush=True)
        load = os.getloadavg()[0]
        wall, cpu = time.perf_counter(), time.process_time()
        tagged = make_cloze.tag_documents(docs, cfg.window, factory, workers=workers, progress=False)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        fingerprint = tagged.encoded
        same = reference is None or fingerprint == reference
        reference = reference or fingerprint
        row = {"run": name, "books": len(docs), "of_books": len(all_docs), "tokens": tagged.tokens,
               "wall_s": round(wall, 1), "tokens_per_s": round(tagged.tokens / wall),
               "load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1), "same_tagging": same}
        if workers == 0:
            row["cpu_tokens_per_s"] = round(tagged.tokens / cpu)
        results.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"questions": count_questions(args.style, tagged, cfg)}))


def count_questions(style: str, tagged: make_cloze.Tagged, cfg: make_cloze.ClozeConfig) -> int:
    n = 0
    for i in range(len(tagged.docs)):
        sents = tagged.sentences(i)
        rng = random.Random(0)
        if style == "cnn":
            n += sum(1 for _ in cnn_recipe.questions(sents, rng, context=cfg.context))
        else:
            n += sum(1 for _ in cbt_recipe.questions(sents, style.split("-")[1].upper(), rng))
    return n


if __name__ == "__main__":
    main()
