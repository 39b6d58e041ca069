"""The steps of ``device_run.py`` that fill the card with several runs: ``ensemble`` (IAA seeds
side by side, then the ensemble against its mean member on valid) and ``shared_card`` (trials as
separate processes and as trainers in one process, one CUDA stream each); and ``targets``, the
goals the summary reports against.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import device_gpu
import device_steps as steps
from device_steps import COMPARE_BATCH, RUN_START_S, ROOT, partial, say

ENSEMBLE_SEEDS = 5
SCORE_S = 15                    # ensemble: the members score valid after their runs
TARGETS = {"train_ex_s_b32": 3000, "infer_ex_s_b32": 20000, "card_train_ex_s": 15000, "cn_epoch_s": 40,
           "compare_early_stop": "all three runs early-stopped, iaa ahead", "ensemble_gain": 2.0,
           "ray_tune_trials_per_card": 4, "ray_train_cuda": "a Ray Train run on CUDA with NCCL finishes and logs its checks"}


def step_ensemble(args) -> dict:
    """``ENSEMBLE_SEEDS`` IAA runs (seeds 0..4; 2 with ``--tiny``) side by side to their early stop or the time left;
    each scores valid with its best weights; then the ensemble (mean of the members'
    probabilities) against the mean member's accuracy, in points."""
    import torch

    minutes = max(0.2, (args.seconds - RUN_START_S - SCORE_S) / 60)
    seeds = 2 if args.tiny else ENSEMBLE_SEEDS
    threads = steps._threads(args, seeds)
    work = Path(args.work)
    commands = {f"seed{s}": steps._self(args, "train_one", "--model", "iaa", "--batch-size", str(COMPARE_BATCH),
                                        "--minutes", f"{minutes:.2f}", "--threads", str(threads), "--seed", str(s),
                                        "--save-valid", str(work / f"ensemble-valid-{s}.pt"))
                for s in range(seeds)}
    out: dict = {"minutes_each": round(minutes, 2), "runs": {name: {"status": "running", "checks": []} for name in commands}}
    failed = steps.runs_side_by_side(commands, out)
    saved = [torch.load(work / f"ensemble-valid-{s}.pt") for s in range(seeds)
             if (work / f"ensemble-valid-{s}.pt").is_file()]
    if len(saved) >= 2:
        answer = saved[0]["answer"]
        members = [float((m["log_p"].argmax(1) == answer).float().mean()) for m in saved]
        probs = torch.stack([m["log_p"].exp() for m in saved]).mean(0)    # (N, C)
        out["member_valid_acc"] = [round(a, 4) for a in members]
        out["mean_member_valid_acc"] = round(sum(members) / len(members), 4)
        out["ensemble_valid_acc"] = round(float((probs.argmax(1) == answer).float().mean()), 4)
        out["gain_points"] = round(100 * (out["ensemble_valid_acc"] - out["mean_member_valid_acc"]), 2)
        say(f"ensemble of {len(saved)}: valid {out['ensemble_valid_acc']:.4f} against the mean member "
            f"{out['mean_member_valid_acc']:.4f} ({out['gain_points']:+.2f} points)")
    partial(out)
    if failed:
        raise RuntimeError(f"runs failed: {', '.join(failed)} (the others' figures are in the summary)")
    return out


# --- shared_card: separate processes, and trainers in one process -----------------------------


def _in_process_rate(args, n: int) -> dict:
    """n trainers in this process (``iaa.jobs.training.side_by_side.in_turn``), one CUDA stream
    each, stepped in turn over one common window: their examples per second in all. Their steps
    are captured where ``device_gpu.captured_step`` can capture them, else eager."""
    import itertools

    from iaa.jobs.train import bench
    from iaa.jobs.training.side_by_side import in_turn
    from iaa.jobs.training.step import train_step

    size = 4 if args.tiny else COMPARE_BATCH
    window = 1.0 if args.tiny else steps.SHARED_WINDOW_S
    runs, graphed, clock = [], 0, {"opens": float("inf"), "closes": float("inf")}
    for i in range(n):
        cfg, model, optimizer = steps._reader(args, "bf16")
        step, note = device_gpu.captured_step(args, model)
        if step is None:
            step = lambda batch, m=model, o=optimizer: train_step(m, o, batch)    # noqa: E731
        else:
            graphed += 1
        pool = bench.synthetic_examples(8 * size, seed=i, vocab_size=cfg.vocab_size)
        batches = itertools.cycle([bench.collate(b, args.device) for b in bench.bucketed_batches(pool, size)])
        runs.append(_run_until(step, batches, clock, size))
    in_turn([itertools.islice(run, 3) for run in runs], args.device)   # warm-up (and capture)
    steps._sync(args.device)
    clock["opens"] = time.perf_counter()
    clock["closes"] = clock["opens"] + window
    counts = in_turn(runs, args.device)
    steps._sync(args.device)
    seconds = time.perf_counter() - clock["opens"]
    return {"aggregate_train_examples_per_s": round(sum(counts) * size / seconds, 1), "captured": graphed,
            "encoder": note, "window_s": round(seconds, 3)}


def _run_until(step, batches, clock: dict, size: int):
    """Steps of one in-process trial: warm-up steps, then steps until the window closes."""
    while time.perf_counter() < clock["closes"]:
        step(next(batches))
        yield size


def step_shared_card(args) -> dict:
    """``device_steps.step_shared_card`` (n separate processes), then n trainers in one process."""
    out = steps.step_shared_card(args)
    for n in (2, 1) if args.tiny else (8, 4, 2, 1):
        out[f"in_process_{n}"] = _in_process_rate(args, n)
        say(f"{n} trainers in one process: {out[f'in_process_{n}']['aggregate_train_examples_per_s']:,.0f} ex/s in all")
        partial(out)
    return out


# --- the summary's targets -----------------------------------------------------------------------


def _target(measured, goal, met: bool) -> dict:
    return {"measured": measured, "goal": goal, "met": bool(met) if measured is not None else False}


def _best(values) -> float | None:
    found = [v for v in values if isinstance(v, (int, float))]
    return max(found) if found else None


def targets(summary: dict) -> dict:
    """Each goal with what the run measured (None where its step did not run) and whether it is met."""
    bench, compare = summary.get("bench") or {}, summary.get("compare") or {}
    variants = [v for v in bench.values() if isinstance(v, dict)] + list((bench.get("steps") or {}).values())
    b32 = [v for v in variants if v.get("batch_size") == COMPARE_BATCH]
    train = _best(v.get("train_examples_per_s") for v in b32)
    infer = _best(v.get("infer_examples_per_s") for v in b32)
    shared = summary.get("shared_card") or {}
    card = _best([compare.get("card_train_examples_per_s")]
                 + [v.get("aggregate_train_examples_per_s") for v in shared.values() if isinstance(v, dict)])
    runs = compare.get("runs") or {}
    epoch = (runs.get("iaa") or {}).get("seconds_per_epoch_training_only")
    stopped = [k for k, r in runs.items() if r.get("status") == "early-stopped"]
    ranking = compare.get("ranking") or []
    early = {"early_stopped": stopped, "ranking": ranking} if runs else None
    gain = (summary.get("ensemble") or {}).get("gain_points")
    ray_card = summary.get("ray_card") or {}
    sweep, ray_run = ray_card.get("tune") or {}, ray_card.get("train") or {}
    at_once = sweep.get("trials_at_once") if sweep.get("worked") and sweep.get("gpus_per_trial") else None
    ray_train = {k: ray_run.get(k) for k in ("worked", "backend", "state", "checks_logged", "card_processes_seen")} \
        if ray_run else None
    return {
        "train_ex_s_b32": _target(train, TARGETS["train_ex_s_b32"], train is not None and train >= TARGETS["train_ex_s_b32"]),
        "infer_ex_s_b32": _target(infer, TARGETS["infer_ex_s_b32"], infer is not None and infer >= TARGETS["infer_ex_s_b32"]),
        "card_train_ex_s": _target(card, TARGETS["card_train_ex_s"], card is not None and card >= TARGETS["card_train_ex_s"]),
        "cn_epoch_s": _target(epoch, TARGETS["cn_epoch_s"], epoch is not None and epoch < TARGETS["cn_epoch_s"]),
        "compare_early_stop": _target(early, TARGETS["compare_early_stop"],
                                      len(stopped) == 3 and ranking[:1] == ["iaa"]),
        "ensemble_gain": _target(gain, TARGETS["ensemble_gain"], gain is not None and gain >= TARGETS["ensemble_gain"]),
        "ray_tune_trials_per_card": _target(at_once, TARGETS["ray_tune_trials_per_card"],
                                            at_once is not None and at_once >= TARGETS["ray_tune_trials_per_card"]),
        "ray_train_cuda": _target(ray_train, TARGETS["ray_train_cuda"],
                                  bool(ray_run.get("worked")) and ray_run.get("backend") == "nccl"),
    }


def commit() -> str | None:
    """The checkout's commit, or None where it is no git checkout."""
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def source_digest() -> str:
    """A SHA-256 of the tracked source (``iaa/``, ``benchmarks/`` and ``tests/`` Python files, by
    path and content): the same for the same code wherever it runs, so a summary names the code it
    measured even where the copy's ``HEAD`` is not the commit of its files (``commit`` above).
    ``python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import device_cards; print(device_cards.source_digest())"``
    in a checkout gives the digest to compare."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(p for folder in ("iaa", "benchmarks", "tests") for p in (ROOT / folder).rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


STEP_FUNCTIONS = {name[len("step_"):]: fn for name, fn in globals().items() if name.startswith("step_")}
