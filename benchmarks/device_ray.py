"""The ``ray_card`` step of benchmarks/device_run.py: the project's Ray Train run and Ray Tune sweep on the card.

- **Ray.** Where Ray is not installed (the GPU machine's image), the step unpacks the slimmed bundle
  that ``python benchmarks/ray_bundle.py`` builds (``device-ray/site-cpXY.tar.xz`` for this Python)
  into its work folder and puts it first on ``PYTHONPATH``, which the Ray processes it starts
  inherit. Without Ray and without a bundle it does nothing and says why (``"not_run"``; the
  runner lists it among the ``"skipped"`` steps).
- **Tracking.** MLflow does not travel, so both jobs track into the tracking port's in-memory fake
  (``tests/fakes.py``); the sweep's Optuna study is real (SQLite in the work folder).
- **Data.** The cbt-recon CN folder that ``prepare_cn`` left in the work folder, else demo data
  generated here (the question is Ray on the card, not accuracy).
- **train**, first, as the shorter job: ``iaa.jobs.train.train.run_tracked`` on one Ray Train
  worker with one GPU, whose process group is NCCL (:func:`iaa.platform.ray_train.process_group_backend`); the step watches
  ``nvidia-smi`` for the worker's process on the card while it runs.
- **tune.** ``iaa.jobs.tune.tune.run`` on :class:`~iaa.platform.sweeps.launch.RayLauncher` with
  ``gpus_per_worker=GPU_SHARE``: Ray Tune places ``1 / GPU_SHARE`` trials on one card at once. A
  Tune callback counts the trials running at each result and sums their ``train_examples_per_s``;
  every trial trains for ``TRIAL_MINUTES``.

``--device cpu --tiny`` runs the same path with the tiny model on CPU trials (no fraction of a GPU,
gloo), where Ray is installed: the test suite does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tarfile
import threading
import time
from pathlib import Path

from device_steps import ROOT, TINY_MODEL, output_of, cn_source, demo_cn, partial, say

GPU_SHARE = 0.25              # of the card per trial: four trials at once
TUNE_TRIALS = 4               # one round: four at once on the card
TRIAL_MINUTES = 0.75          # each trial's training, cut by train.max_minutes
TRAIN_MINUTES = 0.5           # the Ray Train run's
BATCH = 32
DEMO_SIZES = {"train": 20000, "valid": 1000, "test": 200}
TINY_SIZES = {"train": 192, "valid": 64, "test": 64}
SPACE = "model.hidden_dim: [64, 128, 256]\nmodel.steps: [1, 2, 4]\n"   # nine configurations
TINY_SPACE = "model.hidden_dim: [8, 12]\nmodel.steps: [1, 2]\n"


def bundle_path(python: tuple[int, int] = sys.version_info[:2]) -> Path:
    return ROOT / "device-ray" / f"site-cp{python[0]}{python[1]}.tar.xz"


def ensure_ray(work: Path) -> str | None:
    """Make Ray importable here and in the processes Ray starts: ``"installed"``, ``"bundle"``
    (unpacked from :func:`bundle_path` into ``work/ray-site``), or None where neither is there."""
    if importlib.util.find_spec("ray") is not None:
        return "installed"
    bundle = bundle_path()
    if not bundle.is_file():
        return None
    site = work / "ray-site"
    started = time.monotonic()
    with tarfile.open(bundle, "r:xz") as tar:
        tar.extractall(site, filter="data")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    say(f"Ray bundle {bundle.name} unpacked in {time.monotonic() - started:.1f} s")
    return "bundle"


def unmet_requirements(site: Path) -> list[str]:
    """Each requirement of the packages in ``site`` (extras aside) that this interpreter's path
    does not meet, as ``"dist: requirement (found version)"``; where the bundle met the image."""
    from importlib import metadata

    from packaging.requirements import Requirement

    unmet = []
    for dist in metadata.distributions(path=[str(site)]):
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                found = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                found = None
            if found is None or not req.specifier.contains(found, prereleases=True):
                unmet.append(f"{dist.metadata['Name']}: {req} (found {found or 'none'})")
    return sorted(set(unmet))


def _prepared(args, work: Path) -> tuple[Path, str]:
    """The prepared data for both jobs, and what it is."""
    from iaa.jobs.datasets import prepare

    if (work / "cbt-cn" / "manifest.json").is_file():
        return work / "cbt-cn", "the CN data that prepare_cn prepared"
    source = None if args.tiny else cn_source(Path(args.data))
    what = "cbt-recon CN"
    if source is None:
        sizes = TINY_SIZES if args.tiny else DEMO_SIZES
        source, what = demo_cn(work, sizes), f"demo ({sizes['train']:,} training examples, generated)"
    prepare.run("cbt-cn", source, work / "ray-prepared", on_error="skip", progress=False)
    return work / "ray-prepared", what


def _sets(args, minutes: float, searched: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Batch 32 and training cut at ``minutes`` (the tiny model: two epochs); none of ``searched``."""
    if args.tiny:
        sets = [*(f"model.{k}={v}" for k, v in TINY_MODEL.items()), "train.precision=fp32", "train.max_epochs=2",
                "train.check_every=4"]
    else:
        sets = [f"train.max_minutes={minutes}", "train.max_epochs=50"]
    return tuple(s for s in [f"train.batch_size={BATCH}", *sets] if s.split("=")[0] not in searched)


def _overlap_callback():
    """A Ray Tune callback: at each trial result, the trials running and the sum of their latest
    ``train_examples_per_s``; the peak of each, and every trial's last result."""
    from ray import tune

    class Overlap(tune.Callback):
        def __init__(self) -> None:
            self.rate: dict[str, float] = {}
            self.last: dict[str, dict] = {}
            self.peak_running = 0
            self.peak_examples_per_s = 0.0
            self.started = self.ended = None

        def on_trial_start(self, iteration, trials, trial, **info) -> None:
            self.started = self.started or time.monotonic()

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            running = {t.trial_id for t in trials if t.status == "RUNNING"}
            if isinstance(result.get("train_examples_per_s"), (int, float)):
                self.rate[trial.trial_id] = float(result["train_examples_per_s"])
            self.last[trial.trial_id] = {k: result.get(k) for k in ("steps", "checks", "valid_acc")}
            self.peak_running = max(self.peak_running, len(running))
            together = sum(rate for trial_id, rate in self.rate.items() if trial_id in running)
            self.peak_examples_per_s = max(self.peak_examples_per_s, together)

        def on_trial_complete(self, iteration, trials, trial, **info) -> None:
            self.ended = time.monotonic()

        def on_trial_error(self, iteration, trials, trial, **info) -> None:
            self.ended = time.monotonic()

    return Overlap()


class _CardWatch:
    """Polls ``nvidia-smi`` for the processes on the card (other than this one) while a run goes:
    every one seen, the most seen in one poll, and their peak memory together."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s, self.seen, self.peak_at_once, self.peak_bytes = every_s, set(), 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "_CardWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            text = output_of(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
            now = {}
            for line in (text or "").splitlines():
                pid, _, mib = line.partition(",")
                if pid.strip().isdigit() and int(pid) != os.getpid():
                    now[int(pid)] = int(float(mib or 0) * 2**20)
            self.seen |= set(now)
            self.peak_at_once = max(self.peak_at_once, len(now))
            self.peak_bytes = max(self.peak_bytes, sum(now.values()))


def _tune(args, prepared: Path, work: Path, tracker) -> dict:
    from iaa.jobs.tune import tune
    from iaa.platform.sweeps.launch import RayLauncher

    cuda = args.device == "cuda"
    space = work / "ray-space.yaml"
    space.write_text(TINY_SPACE if args.tiny else SPACE, encoding="utf-8")
    overlap = _overlap_callback()
    request = tune.TuneRequest(dataset="cbt-cn", data=prepared, num_samples=4 if args.tiny else TUNE_TRIALS,
                               max_epochs=2 if args.tiny else 50, search_space=space, sampler="random",
                               gpus_per_worker=GPU_SHARE if cuda else 0.0,
                               sets=_sets(args, TRIAL_MINUTES, searched=("model.hidden_dim", "model.steps")),
                               workdir=work / "ray-tune", name="ray-card", show_progress=False)
    started = time.monotonic()
    with _CardWatch() as watch:
        result = tune.run(request, lambda uri: tracker, RayLauncher(callbacks=[overlap]))
    seconds = time.monotonic() - started
    examples = sum(int(last.get("steps") or 0) * BATCH for last in overlap.last.values())
    busy = (overlap.ended - overlap.started) if overlap.started and overlap.ended else None
    out = {"worked": result.trials >= request.num_samples and result.best_valid_acc is not None,
           "trials": result.trials, "gpus_per_trial": request.gpus_per_worker,
           "trials_at_once": overlap.peak_running, "card_processes_at_once": watch.peak_at_once,
           "peak_train_examples_per_s_together": round(overlap.peak_examples_per_s, 1),
           "train_examples_per_s_over_the_sweep": round(examples / busy, 1) if busy else None,
           "examples": examples, "seconds": round(seconds, 1), "trial_seconds": round(busy, 1) if busy else None,
           "best_valid_acc": result.best_valid_acc,
           "tracked_runs": len(tracker.children(result.parent_run_id)) if result.parent_run_id else 0}
    say(f"tune: {out['trials']} trials, {out['trials_at_once']} at once at {request.gpus_per_worker} GPU each, "
        f"{out['peak_train_examples_per_s_together']:,.0f} ex/s together at the peak, {seconds:.0f} s")
    return out


def _train(args, prepared: Path, work: Path, tracker) -> dict:
    from iaa.jobs.datasets import resolve
    from iaa.jobs.ports import TrainRun
    from iaa.jobs.train import train
    from iaa.platform.ray_train import process_group_backend
    from iaa.platform.sweeps.launch import RayLauncher

    cuda = args.device == "cuda"
    cfg = resolve.job_config("cbt-cn", prepared, sets=_sets(args, TRAIN_MINUTES))
    started = time.monotonic()
    with _CardWatch() as watch:
        result = train.run_tracked(TrainRun(cfg, prepared, work / "ray-train-run", workers=1,
                                            gpus_per_worker=1.0 if cuda else 0.0, storage=str(work / "ray-train-storage"),
                                            show_progress=False), tracker, RayLauncher())
    run = tracker.runs[result.mlflow_run_id]
    checks = len(run.metrics.get("valid_acc", []))
    rates = [p.value for p in run.metrics.get("train_examples_per_s", [])]
    out = {"backend": process_group_backend(cuda), "workers": 1, "gpus_per_worker": 1.0 if cuda else 0.0,
           "state": run.state, "checks_logged": checks, "checkpoint": Path(result.checkpoint).is_file(),
           "train_examples_per_s": round(max(rates), 1) if rates else None,
           "valid_acc": run.last("valid_acc") if checks else None, "seconds": round(time.monotonic() - started, 1),
           "card_processes_seen": len(watch.seen), "card_peak_bytes": watch.peak_bytes or None}
    out["worked"] = run.state == "FINISHED" and checks > 0 and out["checkpoint"] and (not cuda or bool(watch.seen))
    say(f"train: Ray Train, 1 worker, {out['backend']}: {run.state}, {checks} checks logged, "
        f"{out['card_processes_seen']} process(es) seen on the card")
    return out


def step_ray_card(args) -> dict:
    """A Ray Train run with NCCL, then Ray Tune trials sharing the card, both the project's jobs."""
    work = Path(args.work)
    how = ensure_ray(work)
    if how is None:
        reason = (f"no Ray here and no {bundle_path().relative_to(ROOT)}: run `python benchmarks/ray_bundle.py` "
                  "on a machine with pip, bring device-ray/ with the checkout and run --part 3")
        say(f"skipped: {reason}")
        return {"not_run": reason}
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes import FakeTracker

    import ray

    prepared, data = _prepared(args, work)
    out = {"ray": ray.__version__, "ray_from": how, "tracker": "in-memory fake (tests/fakes.py): no MLflow",
           "data": data}
    if how == "bundle":
        out["unmet_requirements"] = unmet_requirements(work / "ray-site")
        for line in out["unmet_requirements"]:
            say(f"unmet: {line}")
    partial(out)
    tracker = FakeTracker()
    for name, job in (("train", _train), ("tune", _tune)):
        try:
            out[name] = job(args, prepared, work, tracker)
        except Exception as error:  # noqa: BLE001 - the other job still runs; the summary says what failed
            out[name] = {"worked": False, "error": f"{type(error).__name__}: {str(error)[:500]}"}
            say(f"{name} failed: {out[name]['error']}")
        partial(out)
    if ray.is_initialized():
        ray.shutdown()
    failed = [name for name in ("train", "tune") if not out[name].get("worked")]
    if failed:
        what = json.dumps({k: out[k] for k in failed})[:800]
        raise SystemExit(f"ray_card: {' and '.join(failed)} did not work: {what}")
    return out


STEP_FUNCTIONS = {"ray_card": step_ray_card}
