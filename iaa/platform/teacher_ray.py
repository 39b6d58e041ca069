"""The distillation teacher's member scoring as Ray tasks: one task per member, one CPU and one
torch thread each, at most ``workers`` at a time. Each task runs the job's ``score_member``
(:func:`iaa.jobs.distill.teacher.score_member`, as :func:`iaa.jobs.distill.teacher.score_in_process` does) and
writes its predictions file; on a cluster of several nodes the output folder must be shared storage."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from iaa import logs
from iaa.jobs.ports import MemberScore, Scorer


def _score_one(score_member: MemberScore, checkpoint: str, prepared: str, split: str, limit: int | None,
               out: str) -> str:
    import torch

    torch.set_num_threads(1)
    return str(score_member(Path(checkpoint), Path(prepared), split, limit, Path(out)))


def scorer(score_member: MemberScore, workers: int | None = None, address: str | None = None,
           show_progress: bool = True) -> Scorer:
    """A ``Scorer`` that runs the job's ``score_member`` for each member on the Ray cluster at
    ``address`` (default: a local one)."""

    def score(checkpoints: Sequence[Path], prepared: Path, split: str, limit: int | None,
              out_dir: Path) -> list[Path]:
        import ray

        from iaa.platform.cluster.connect import connect

        connect(address or "local")
        slots = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(num_cpus=1)(_score_one)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        jobs = [(score_member, str(c), str(prepared), split, limit, str(Path(out_dir) / f"{i:02d}-{split}.parquet"))
                for i, c in enumerate(checkpoints)]
        pending: dict = {}
        done: dict[int, str] = {}
        with logs.progress(f"teacher: scoring members on Ray ({slots} at a time)", "member", total=len(jobs),
                           shown=show_progress) as bar:
            for i, job in enumerate(jobs):
                if len(pending) >= slots:
                    _collect(pending, done, bar)
                pending[task.remote(*job)] = i
            while pending:
                _collect(pending, done, bar)
        return [Path(done[i]) for i in range(len(jobs))]

    return score


def _collect(pending: dict, done: dict[int, str], bar) -> None:
    import ray

    ready, _ = ray.wait(list(pending), num_returns=1)
    for ref in ready:
        done[pending.pop(ref)] = ray.get(ref)
        bar.update(1)
