"""An ensemble's soft targets on the training split, computed once and kept in the work folder.

The teacher of ``iaa-cli distill`` is an ensemble made by ``iaa-cli ensemble``: its selected
members' candidate distributions (the evaluate job's renormalised pointer-sums), averaged by
:mod:`iaa.jobs.ensemble.ensemble` exactly as the ensemble itself averages them. They are computed in
batches by the evaluate job, one member at a time (or as parallel tasks: ``Scorer``), and written
to ``WORKDIR/distill/teachers/NAME.parquet`` (:func:`iaa.jobs.distill.distill.teacher_path`):

| column | type | |
|---|---|---|
| ``example_id`` | string | |
| ``candidate_words`` | list<string> | the example's candidates, in order |
| ``teacher_probs`` | list<float32> | the members' mean distribution over them |

The file's metadata (key ``iaa.teacher``) records the ensemble, the split, the number of rows,
the data's vocabulary hash, each member's checkpoint with its digest, and the sha256 of the
table's own contents (``content_sha256``), so an edited distribution is refused like a stale one. A teacher whose members'
checkpoints (or whose data) changed since is stale, and :func:`load` refuses it, as it refuses a
file that does not match the training split.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iaa.data.loading.loader import TEACHER_COLUMN
from iaa.errors import IaaError
from iaa.files import atomic_write
from iaa.jobs.evaluation.ensembling import ensemble_record
from iaa.jobs.evaluation.ensembling.ensemble_record import EnsembleRecord
from iaa.jobs.ports import Scorer
from iaa.jobs.workdir.paths import ENSEMBLE_RECORD

META_KEY = b"iaa.teacher"
SCHEMA = pa.schema([("example_id", pa.string()), ("candidate_words", pa.list_(pa.string())),
                    (TEACHER_COLUMN, pa.list_(pa.float32()))])
SUM_TOLERANCE = 1e-3   # a stored distribution must add up to 1 within this (float32 storage)

# (checkpoints, prepared data, split, first N rows or None, output folder) -> one predictions file
# per checkpoint, in the evaluate job's schema.
class TeacherError(IaaError):
    """The ensemble cannot teach, or a stored teacher is damaged, stale or for other data."""


@dataclass(frozen=True)
class Member:
    checkpoint: Path
    digest: str          # iaa.jobs.modeling.checkpoint.digest of the checkpoint's config and weights

    def to_dict(self) -> dict[str, str]:
        return {"checkpoint": str(self.checkpoint), "digest": self.digest}


def members_of(ensemble_dir: Path) -> tuple[EnsembleRecord, list[Member]]:
    """The ensemble's record (:data:`~iaa.jobs.workdir.paths.ENSEMBLE_RECORD`) and its selected members with their digests."""
    from iaa.jobs.modeling import checkpoint

    summary_path = Path(ensemble_dir) / ENSEMBLE_RECORD
    if not summary_path.is_file():
        raise TeacherError(f"{ensemble_dir} is not an ensemble folder (no {ENSEMBLE_RECORD}): make one with "
                           "`iaa-cli ensemble`, then pass its folder (WORKDIR/ensembles/NAME)")
    try:
        paths = ensemble_record.members(ensemble_dir)     # each the file the ensemble was made of
        summary = ensemble_record.read(ensemble_dir)      # its paths where the work folder is now
    except IaaError as err:
        raise TeacherError(str(err)) from None
    members = []
    for path in paths:
        try:
            state = checkpoint.load(path)
            members.append(Member(path, checkpoint.digest({"config": state["config"], "model": state["model"]})))
        except checkpoint.CheckpointError as err:
            raise TeacherError(f"member of the ensemble {ensemble_dir}: {err}") from None
    return summary, members


def compute(members: Sequence[Member], prepared: Path, split: str, limit: int | None, work_dir: Path,
            score: Scorer) -> pa.Table:
    """The members' averaged distribution on ``split`` (its first ``limit`` rows), by example."""
    from iaa.jobs.evaluation.ensembling import averaging as ensemble_job

    files = score([m.checkpoint for m in members], prepared, split, limit, work_dir)
    aligned = ensemble_job.align(split, [(str(m.checkpoint), pq.read_table(f)) for m, f in zip(members, files)])
    mean = aligned.mean_probs(range(aligned.num_members))                     # (E, C) float64
    probs = [mean[e, : len(words)].astype(np.float32).tolist() for e, words in enumerate(aligned.candidate_words)]
    return pa.table({"example_id": aligned.example_ids, "candidate_words": aligned.candidate_words,
                     TEACHER_COLUMN: probs}, schema=SCHEMA)


def content_digest(table: pa.Table) -> str:
    """sha256 of a teacher table's ids, candidates and distributions (float32 bytes)."""
    h = hashlib.sha256()
    for name in SCHEMA.names:
        column = table.column(name).combine_chunks()
        if pa.types.is_list(column.type):
            h.update(np.diff(column.offsets.to_numpy()).astype(np.int64).tobytes())
            column = column.flatten()
        if pa.types.is_floating(column.type):
            h.update(column.to_numpy(zero_copy_only=False).astype(np.float32).tobytes())
        else:
            h.update("\0".join(column.to_pylist()).encode("utf-8"))
        h.update(b"|")
    return h.hexdigest()


def write(table: pa.Table, path: Path, *, ensemble_dir: Path, members: Sequence[Member], split: str,
          limit: int | None, vocab_hash: str) -> Path:
    meta = {"ensemble": str(ensemble_dir), "split": split, "limit": limit, "rows": table.num_rows,
            "vocab_hash": vocab_hash, "members": [m.to_dict() for m in members],
            "content_sha256": content_digest(table)}
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    return atomic_write(Path(path), lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def read_meta(path: Path) -> dict[str, Any]:
    try:
        raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    except (OSError, pa.ArrowInvalid) as err:
        raise TeacherError(f"{path}: not a readable Parquet file ({err}); delete it or pass `refresh_teacher`") from None
    if raw is None:
        raise TeacherError(f"{path}: no teacher metadata ({META_KEY.decode()}); it was not written by "
                           "`iaa-cli distill`: delete it or pass `refresh_teacher`")
    return json.loads(raw)


def check_fresh(path: Path, members: Sequence[Member], vocab_hash: str, limit: int | None) -> None:
    """Refuse a stored teacher made from other checkpoints, other data or another row count.

    Members compare by digest (config and weights), in order: the same members at another place
    (a copied or moved work folder) teach the same.
    """
    meta = read_meta(path)
    then = [(m["checkpoint"], m["digest"]) for m in meta.get("members", [])]
    now = [(str(m.checkpoint), m.digest) for m in members]
    if [d for _, d in then] != [d for _, d in now]:
        changed = next(((p, d) for (p, d), (_, d2) in zip(now, then) if d != d2), None)
        what = (f"member {changed[0]} changed since (digest {changed[1][:12]}, the teacher has another)"
                if changed and len(then) == len(now) else f"its members were {[p for p, _ in then]}")
        raise TeacherError(f"{path}: stale teacher: {what}; pass `refresh_teacher` to compute it again")
    if meta.get("vocab_hash") != vocab_hash:
        raise TeacherError(f"{path}: stale teacher: computed on data with another vocabulary; "
                           "pass `refresh_teacher` to compute it again")
    if meta.get("limit") != limit:
        raise TeacherError(f"{path}: computed for {meta.get('limit') or 'all'} training examples, not "
                           f"{limit or 'all'}; pass `refresh_teacher` to compute it again")


def attach(train: pa.Table, path: Path) -> pa.Table:
    """``train`` with the teacher's ``teacher_probs`` column, matched by ``example_id``.

    Raises TeacherError naming the file and the first example that is missing, has other
    candidates, or has a distribution that is not one (negative, NaN, or not adding up to 1).
    """
    try:
        teacher = pq.read_table(path, schema=SCHEMA)
    except (OSError, pa.ArrowInvalid, ValueError) as err:
        raise TeacherError(f"{path}: not a teacher file ({str(err).splitlines()[0]}); pass `refresh_teacher`") from None
    row_of = {e: i for i, e in enumerate(teacher.column("example_id").to_pylist())}
    words = teacher.column("candidate_words").to_pylist()
    probs = teacher.column(TEACHER_COLUMN).to_pylist()
    column = []
    for example_id, cands in zip(train.column("example_id").to_pylist(), train.column("candidate_words").to_pylist()):
        i = row_of.get(example_id)
        if i is None:
            raise TeacherError(f"{path}: no teacher distribution for training example {example_id!r}; "
                               "pass `refresh_teacher`")
        p = probs[i]
        if words[i] != cands or p is None or len(p) != len(cands):
            raise TeacherError(f"{path}: example {example_id!r} (row {i}): its candidates differ from the training "
                               "data's; pass `refresh_teacher`")
        if not all(math.isfinite(v) and v >= 0 for v in p) or abs(sum(p) - 1.0) > SUM_TOLERANCE:
            raise TeacherError(f"{path}: example {example_id!r} (row {i}): not a distribution "
                               f"(sum {sum(p):.4f}); pass `refresh_teacher`")
        column.append(p)
    recorded = read_meta(path).get("content_sha256")
    if recorded != content_digest(teacher):
        what = "carries no content digest (written by an older version)" if recorded is None else \
            "its contents do not match the digest written with them (edited after distill wrote it)"
        raise TeacherError(f"{path}: {what}; pass `refresh_teacher` to compute it again")
    return train.append_column(pa.field(TEACHER_COLUMN, pa.list_(pa.float32())), pa.array(column, pa.list_(pa.float32())))


def score_member(checkpoint: Path, prepared: Path, split: str, limit: int | None, out: Path) -> Path:
    """One member's predictions on ``split`` (its first ``limit`` rows) with the evaluate job."""
    from iaa.jobs.evaluation import evaluate

    return Path(evaluate.run(Path(checkpoint), Path(prepared), split, Path(out), limit=limit).predictions)


def score_in_process(checkpoints: Sequence[Path], prepared: Path, split: str, limit: int | None,
                     out_dir: Path) -> list[Path]:
    """Each member's predictions, one after the other (the default ``Scorer``)."""
    return [score_member(c, prepared, split, limit, Path(out_dir) / f"{i:02d}-{split}.parquet")
            for i, c in enumerate(checkpoints)]
