"""The training loop: determinism, checkpoints, kill-and-resume, and the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from iaa.cli import cli
from iaa.jobs.modeling import checkpoint
from iaa.jobs.datasets import resolve
from iaa.jobs.train import train as train_job
from tests._faults import assert_says
from tests._tiny import TINY_SETS, kill_after_checks, make_tiny_prepared


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _cfg(prepared: Path, *extra: str):
    return resolve.job_config("cbt-ne", prepared, sets=(*TINY_SETS, "train.threads=1", *extra))


def _params(path: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(path)["model"]


def test_same_seed_gives_identical_weights(tiny: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny)
    a = train_job.run(cfg, tiny, tmp_path / "a", show_progress=False)
    b = train_job.run(cfg, tiny, tmp_path / "b", show_progress=False)
    pa_, pb = _params(Path(a.checkpoint)), _params(Path(b.checkpoint))
    assert all(torch.equal(pa_[k], pb[k]) for k in pa_)
    assert a.best_valid_acc == b.best_valid_acc


def test_checkpoint_round_trip_rebuilds_the_model(tiny: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny)
    result = train_job.run(cfg, tiny, tmp_path / "run", show_progress=False)
    model, loaded_cfg, state = checkpoint.load_model(Path(result.checkpoint))
    assert loaded_cfg == cfg
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state["model"][name])


def test_kill_and_resume_equals_uninterrupted(tiny: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny, "train.check_every=3")
    full = train_job.run(cfg, tiny, tmp_path / "full", show_progress=False)

    run_dir = tmp_path / "killed"
    kill_after_checks(cfg, tiny, run_dir, checks=2)
    resumed = train_job.run(cfg, tiny, run_dir, resume=True, show_progress=False)

    assert resumed.steps == full.steps
    assert resumed.best_valid_acc == full.best_valid_acc
    a, b = _params(Path(full.run_dir) / "checkpoints/last.pt"), _params(run_dir / "checkpoints/last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [
        json.loads(x)["step"] for x in (Path(full.run_dir) / "metrics.jsonl").read_text().splitlines()
    ]


def test_extending_a_finished_run_trains_as_the_longer_run_would(tiny: Path, tmp_path: Path) -> None:
    """The check that closes a budget between two scheduled ones decides nothing (no lr decay, no
    patience), so `--resume` with a larger train.max_epochs goes on as the longer run from the start."""
    short = train_job.run(_cfg(tiny, "train.check_every=5", "train.max_epochs=0.5"), tiny, tmp_path / "x",
                          show_progress=False)
    assert short.steps % 5 != 0                                     # its last check was off the schedule
    longer = _cfg(tiny, "train.check_every=5", "train.max_epochs=1.5")
    extended = train_job.run(longer, tiny, tmp_path / "x", resume=True, show_progress=False)
    full = train_job.run(longer, tiny, tmp_path / "full", show_progress=False)
    assert extended.steps == full.steps
    a, b = _params(tmp_path / "x" / "checkpoints/last.pt"), _params(tmp_path / "full" / "checkpoints/last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_with_nothing_left_to_train_still_says_where_the_run_stands(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.training.summary import head_lines

    cfg = _cfg(tiny)
    done = train_job.run(cfg, tiny, tmp_path / "run", show_progress=False)
    again = train_job.run(cfg, tiny, tmp_path / "run", resume=True, show_progress=False)
    assert (again.steps, again.best_step, again.stop_reason) == (done.steps, done.best_step, done.stop_reason)
    assert again.epoch == pytest.approx(cfg.train.max_epochs) and again.epoch == done.epoch
    assert head_lines(again)[1] == head_lines(done)[1]             # "at step B (epoch b) of S (epoch e); ..."
    assert again.valid_acc == again.best_valid_acc == done.valid_acc == done.best_valid_acc   # made no check: its best
    assert again.metrics["step"] == again.steps == done.metrics["step"] == done.steps


def test_a_training_results_valid_acc_is_its_best_checks_accuracy() -> None:
    """``valid_acc`` is ``best_valid_acc`` under its short name (``train --json`` gives both), never
    the last check's accuracy, which the loop's figures also call ``valid_acc``."""
    from iaa.jobs.training.summary import trained

    figures = {"step": 12, "epoch": 2.0, "train_loss": 1.5, "valid_acc": 0.25, "best_valid_acc": 0.3,
               "best_step": 8, "steps": 12, "stop_reason": "early-stopped"}
    result = trained(figures, checkpoint="/r/best.pt", run_dir="/r")
    assert result.valid_acc == result.best_valid_acc == 0.3
    assert result.fields()["valid_acc"] == 0.3 and "valid_acc" not in result.metrics
    assert trained({"step": 0, "steps": 0}, checkpoint="", run_dir="/r").valid_acc is None


def test_each_check_fits_a_temperature_on_valid_and_the_checkpoint_keeps_it(tiny: Path, tmp_path: Path) -> None:
    """The loop fits the temperature of its validation pass (no second pass); the best checkpoint
    keeps the best check's, the one ``evaluate`` finds again from the checkpoint's answers."""
    from iaa.jobs.evaluation import calibration, evaluate

    result = train_job.run(_cfg(tiny), tiny, tmp_path / "run", show_progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    best = [r for r in rows if r["is_best"]][-1]
    assert best["step"] == result.best_step and all(0.1 <= r["temperature"] <= 10 for r in rows)
    temperature = checkpoint.temperature(checkpoint.load(Path(result.checkpoint)))
    assert temperature == best["temperature"] != 1.0

    found = evaluate.run(Path(result.checkpoint), tiny, "valid", out=tmp_path / "valid.parquet")
    table = pq.read_table(tmp_path / "valid.parquet").to_pylist()
    probs, gold = calibration.padded([r["probs"] for r in table]), np.array([r["gold"] for r in table])
    assert found.temperature == temperature
    assert calibration.fit_temperature(probs, gold) == pytest.approx(temperature, rel=1e-3)
    assert found.calibrated_log_loss < found.log_loss          # the temperature that fits valid best
    assert_says(evaluate.describe(found), f"temperature:  {temperature:.3g}, fitted on valid",
                "the questions it was fitted to")
    written = calibration.padded([r["calibrated_probs"] for r in table])
    assert np.allclose(written, calibration.scaled(probs, temperature), atol=1e-6)


def test_lr_decays_when_valid_accuracy_stalls(tiny: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny, "train.lr=1e-9", "train.patience=100")  # nothing is learnt: every check after the first stalls
    result = train_job.run(cfg, tiny, tmp_path / "run", show_progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    stalled = [r for r in rows[1:] if r["valid_acc"] <= rows[0]["best_valid_acc"]]
    assert stalled, "expected stalled checks"
    assert rows[-1]["lr"] == pytest.approx(1e-9 * 0.8 ** (len(rows) - 1 - sum(
        r["valid_acc"] > p["best_valid_acc"] for p, r in zip(rows, rows[1:]))))
    assert result.stop_reason == "max-epochs"


def test_early_stopping_after_patience(tiny: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny, "train.lr=1e-9", "train.patience=2", "train.max_epochs=50")
    result = train_job.run(cfg, tiny, tmp_path / "run", show_progress=False)
    assert result.stop_reason == "early-stopped"
    assert result.steps < 50 * 12


def test_cli_train_then_evaluate_end_to_end(tiny: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["train", "--data", str(tiny), "--workdir", str(tmp_path / "w"), "--json",
            *[x for s in TINY_SETS for x in ("--set", s)]]
    res = runner.invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(out["checkpoint"]).is_file() and 0.0 <= out["valid_acc"] <= 1.0
    assert (tmp_path / "w" / "mlflow.db").is_file()
    # the temperature the checkpoint answers at, which the last check's ("temperature") need not be
    assert out["checkpoint_temperature"] == checkpoint.temperature(checkpoint.load(Path(out["checkpoint"])))

    preds = tmp_path / "preds.parquet"
    res = runner.invoke(cli, ["evaluate", "--checkpoint", out["checkpoint"], "--data", str(tiny), "--split", "test",
                              "--out", str(preds), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    ev = json.loads(res.stdout.strip().splitlines()[-1])
    bar = [line for line in res.stderr.split("\n") if "scoring:" in line]      # a log's lines, as grep reads them
    assert len(bar) == 1 and bar[0].count("\r") <= 3 and "accuracy" not in bar[0], bar   # its states, then a line of its own
    table = pq.read_table(preds).to_pylist()
    assert len(table) == 64 == ev["examples"]
    recomputed = sum(r["pred"] == r["gold"] for r in table) / len(table)
    assert ev["accuracy"] == pytest.approx(recomputed)
    for row in table:
        assert len(row["probs"]) == len(row["candidate_words"]) == 10
        assert sum(row["probs"]) == pytest.approx(1.0, abs=1e-5)
        assert row["pred"] == max(range(10), key=lambda i: row["probs"][i])


def test_cli_rejects_a_dataset_that_contradicts_the_data(tiny: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["train", "--dataset", "demo", "--data", str(tiny), "--workdir", str(tmp_path)])
    assert res.exit_code == 1 and res.output.count("\n") == 1
    assert res.output.startswith(f"Error: {tiny / 'manifest.json'}: the folder holds cbt-ne, not demo")


def test_cli_unknown_set_key_is_a_clear_error(tiny: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["train", "--data", str(tiny), "--workdir", str(tmp_path), "--set", "train.nope=1"])
    assert res.exit_code == 1 and "train.nope" in res.output


def test_frequency_baseline_counts_candidate_occurrences() -> None:
    from iaa.jobs.evaluation import frequency

    # candidate 1 occurs most in the first doc (gold 1: right); candidate 2 in the second (gold 0: wrong)
    assert frequency.accuracy([[0, 1, 1, -1, 2], [2, 2, 0]], [3, 3], [1, 0]) == 0.5
    assert frequency.accuracy([[0, 1]], [2], [0]) == 1.0  # a tie goes to the first candidate


def test_a_fractional_budget_ends_on_its_check_without_a_one_batch_report(tiny: Path, tmp_path: Path) -> None:
    # 192 rows / 64 = 3 batches an epoch, checks at batches 1 and 3; 1.5 epochs = 4.5 steps. Rounding
    # up would add a last report of one batch at step 5, a cliff at the end of every metric chart.
    cfg = _cfg(tiny, "train.batch_size=64", "train.check_every=0", "train.max_epochs=1.5")
    result = train_job.run(cfg, tiny, tmp_path / "run", show_progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 3, 4] and result.stop_reason == "max-epochs"


@pytest.mark.parametrize("sets", [("train.check_every=0", "train.max_epochs=1.5"),
                                  ("train.check_every=0", "train.max_epochs=2"),
                                  ("train.check_every=0", "train.max_epochs=0.7"),
                                  ("train.check_every=2", "train.max_epochs=1.7"),
                                  ("train.check_every=2", "train.max_epochs=2")])
def test_a_run_makes_the_checks_its_config_counts(tiny: Path, tmp_path: Path, sets: tuple[str, ...]) -> None:
    """``TrainConfig.checks`` is what a sweep tells ASHA (``max_t``) and the cost line: a run that
    trains its whole budget makes exactly that many checks."""
    cfg = _cfg(tiny, "train.batch_size=64", "train.patience=100", *sets)   # 3 batches an epoch
    result = train_job.run(cfg, tiny, tmp_path / "run", show_progress=False)
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert result.stop_reason == "max-epochs" and result.steps == cfg.train.max_steps(3)
    assert len(rows) == cfg.train.checks(3)


def test_the_progress_bar_writes_a_log_file_sparingly(tiny: Path, tmp_path: Path, capsys) -> None:
    """With stderr a file or a pipe, the bar is written at its start, at each check and at the
    end (and every ``LOG_PROGRESS_S``), not ten times a second."""
    result = train_job.run(_cfg(tiny, "train.max_epochs=10", "train.check_every=10"), tiny, tmp_path / "run",
                           show_progress=True)
    writes = capsys.readouterr().err.count("\r")
    checks = result.steps // 10 + 1                      # one every 10 steps, and the last
    assert 0 < writes <= checks + 3, (writes, checks, result.train_seconds)


def test_every_check_records_the_resident_memory_of_the_training_process(tiny: Path, tmp_path: Path) -> None:
    train_job.run(_cfg(tiny, "train.check_every=3"), tiny, tmp_path / "run", show_progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    now = psutil.Process().memory_info().rss / 2**20                # this process trained: the same order
    assert len(rows) >= 2 and all(0.5 * now < row["resident_mb"] < 2 * now for row in rows), (now, rows)


def test_the_resident_memory_of_a_data_parallel_run_sums_its_workers(tiny: Path, tmp_path: Path) -> None:
    from fakes import FakeLink

    from iaa.data.loading.loader import PreparedData
    from iaa.data.prepared.manifest import vocab_card
    from iaa.jobs.ports import WorkerData
    from iaa.jobs.training.loop import fit_on_worker

    class TwinLink(FakeLink):
        """Rank 0 of two workers whose twin holds as much memory and sums the same figures (the
        loop's sums of a few numbers; the random states gathered at a checkpoint stay rank 0's)."""

        world_size = 2

        def all_reduce(self, values, op):
            return [2 * v for v in values] if op == "sum" and len(values) <= 3 else list(values)

    link = TwinLink(tmp_path / "best.pt")
    data = PreparedData.open(tiny)
    fit_on_worker(_cfg(tiny, "train.check_every=3"), link,
                  WorkerData(vocab_hash="", train=data.table("train"), valid=data.table("valid"), vocab=vocab_card(tiny)),
                  threads=1)
    now = psutil.Process().memory_info().rss / 2**20
    assert len(link.history) >= 2 and all(1.2 * now < m["resident_mb"] < 4 * now for m in link.history), now


def test_a_check_interval_longer_than_the_run_is_one_warning_naming_half_an_epoch(tiny: Path) -> None:
    """CNN's preset checks every 5,000 batches: on a small training split the run makes only its
    last check, where the learning-rate decay and the early stop cannot act."""
    from iaa.jobs.config.presets import DATASET_PRESETS
    from iaa.data.loading.loader import num_batches
    from iaa.data.prepared import manifest

    cnn_like = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, f"train.check_every={DATASET_PRESETS['cnn'].train.check_every}"))
    warning = train_job.few_checks_warning(cnn_like, tiny, workers=0)
    n_batches = num_batches(manifest.read(tiny).count("train"), cnn_like.train.batch_size)
    assert_says(warning, "1 validation check", "5,000 batches", "never act",
                f"train.check_every={n_batches // 2}")
    assert train_job.few_checks_warning(resolve.job_config("cbt-ne", tiny, sets=TINY_SETS), tiny, workers=0) is None
    halves = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, "train.check_every=0", "train.max_epochs=0.5"))
    assert train_job.few_checks_warning(halves, tiny, workers=0) is None        # the budget asked for one check


def test_train_says_that_its_check_interval_is_longer_than_the_run(tiny: Path, tmp_path: Path) -> None:
    sets = [a for s in (*TINY_SETS, "train.check_every=5000", "train.max_epochs=1") for a in ("--set", s)]
    result = CliRunner().invoke(cli, ["train", "--data", str(tiny), *sets, "--workdir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    [line] = [w for w in json.loads(result.stdout.splitlines()[-1])["warnings"] if "validation check" in w]
    assert_says(line, "1 validation check", "--set train.check_every=")
