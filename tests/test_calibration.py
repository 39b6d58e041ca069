"""How far a reader's probabilities can be taken at their word: the log-loss of the gold answer
and the expected calibration error, for `evaluate` and for an ensemble and its members."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest

from _faults import assert_says
from iaa.jobs.evaluation.ensembling import averaging
from iaa.jobs.evaluation import calibration
from test_ensemble import write_member


def test_a_reader_right_as_often_as_it_says_has_no_calibration_error():
    # 10 questions answered with 0.8 (8 right) and 10 with 0.6 (6 right): calibrated
    probs = np.array([[0.8, 0.2]] * 10 + [[0.6, 0.4]] * 10)
    gold = np.array([0] * 8 + [1] * 2 + [0] * 6 + [1] * 4)
    found = calibration.of(probs, gold)
    assert found.calibration_error == pytest.approx(0.0, abs=1e-12)
    assert found.mean_confidence == pytest.approx(0.7)
    assert found.log_loss == pytest.approx(-(8 * math.log(0.8) + 2 * math.log(0.2) + 6 * math.log(0.6)
                                             + 4 * math.log(0.4)) / 20)


def test_overconfidence_is_the_gap_weighted_by_each_bins_share():
    # 0.95 said, right half the time (10 questions); 0.55 said, always right (10 questions)
    probs = np.array([[0.95, 0.05]] * 10 + [[0.55, 0.45]] * 10)
    gold = np.array([0] * 5 + [1] * 5 + [0] * 10)
    assert calibration.of(probs, gold).calibration_error == pytest.approx(0.5 * 0.45 + 0.5 * 0.45)


def test_a_gold_answer_given_nothing_costs_the_floor_not_infinity_and_ragged_rows_pad():
    found = calibration.of(calibration.padded([[1.0, 0.0], [0.5, 0.25, 0.25]]), np.array([1, 0]))
    assert found.log_loss == pytest.approx((-math.log(calibration.FLOOR) - math.log(0.5)) / 2)
    assert math.isnan(calibration.of(np.zeros((0, 2)), np.zeros(0)).log_loss)
    assert set(found.fields("valid_")) == {"valid_log_loss", "valid_calibration_error", "valid_mean_confidence"}
    assert_says(calibration.text(found), "log-loss 14.16", "calibration error", "points", "0.750 on average")


def test_an_ensemble_records_its_calibration_beside_its_members(tmp_path: Path):
    ids, cands = ["q0", "q1", "q2", "q3"], [["a", "b"]] * 4
    a = write_member(tmp_path / "a.parquet", ids, cands, [[0.9, 0.1], [0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], [0, 0, 1, 1])
    b = write_member(tmp_path / "b.parquet", ids, cands, [[0.7, 0.3], [0.4, 0.6], [0.1, 0.9], [0.3, 0.7]], [0, 0, 1, 1])
    result = averaging.run([{"valid": a}, {"valid": b}], ["a", "b"], tmp_path / "out")
    gold = np.array([0, 0, 1, 1])
    members = [calibration.of(np.array(p), gold) for p in ([[0.9, 0.1], [0.9, 0.1], [0.2, 0.8], [0.6, 0.4]],
                                                           [[0.7, 0.3], [0.4, 0.6], [0.1, 0.9], [0.3, 0.7]])]
    mean = np.array([[0.8, 0.2], [0.65, 0.35], [0.15, 0.85], [0.45, 0.55]])
    found = result.calibration
    assert found["valid_log_loss"] == pytest.approx(calibration.of(mean, gold).log_loss, abs=1e-6)
    assert found["mean_member_valid_log_loss"] == pytest.approx(np.mean([m.log_loss for m in members]), abs=1e-6)
    assert found["mean_member_valid_calibration_error"] == pytest.approx(
        np.mean([m.calibration_error for m in members]), abs=1e-6)
    assert not any(k.startswith("test_") for k in found)           # no test split: no test figures
    assert json.loads(json.dumps(found)) == found


def _drawn(rng: np.random.Generator, questions: int, candidates: int) -> tuple[np.ndarray, np.ndarray]:
    """Distributions and gold answers drawn from them: calibrated by construction."""
    logits = rng.normal(size=(questions, candidates)) * 2.0
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return probs, np.array([rng.choice(candidates, p=row) for row in probs])


def test_the_fitted_temperature_undoes_a_known_softening_and_keeps_every_answer():
    probs, gold = _drawn(np.random.default_rng(0), 4000, 10)
    softened = calibration.scaled(probs, 2.0)                  # underconfident, as an average of disagreeing members
    temperature = calibration.fit_temperature(softened, gold)
    assert temperature == pytest.approx(0.5, abs=0.03)
    fixed = calibration.scaled(softened, temperature)
    assert np.array_equal(fixed.argmax(axis=1), softened.argmax(axis=1))
    before, after = calibration.of(softened, gold), calibration.of(fixed, gold)
    assert after.calibration_error < before.calibration_error / 3 and after.log_loss < before.log_loss
    assert calibration.fit_temperature(probs, gold) == pytest.approx(1.0, abs=0.08)   # calibrated already


def test_scaling_keeps_zeros_rows_of_zeros_and_sums_to_one():
    probs = np.array([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0], [0.9, 0.1, 0.0, 0.0]])
    scaled = calibration.scaled(probs, 0.5)
    assert scaled[0, 3] == 0 and scaled[2, 2:].tolist() == [0, 0] and scaled[1].tolist() == [0, 0, 0, 0]
    assert scaled[0, :3] == pytest.approx(np.array([0.25, 0.09, 0.04]) / 0.38)
    assert scaled[[0, 2]].sum(axis=1) == pytest.approx([1.0, 1.0])
    assert calibration.scaled(probs, 1.0) is not None and np.array_equal(calibration.scaled(probs, 1.0), probs)


def test_the_temperature_stays_in_its_range_and_is_1_where_nothing_tells():
    right = np.array([[0.6, 0.4]] * 10)
    low, high = calibration.TEMPERATURES
    # said 0.6 where 9 of 10 are right: 0.6^b / (0.6^b + 0.4^b) = 0.9 at b = log 9 / log 1.5
    assert calibration.fit_temperature(right, np.array([0] * 9 + [1])) == pytest.approx(math.log(1.5) / math.log(9),
                                                                                          rel=1e-4)
    assert calibration.fit_temperature(right, np.array([0, 1] * 5)) > 10 * low     # 50% right: soften, not sharpen
    # one candidate left, or a gold answer given nothing: no temperature changes the log-loss; every
    # answer right: the log-loss falls as T does, without a minimum
    assert calibration.fit_temperature(right, np.zeros(10, dtype=int)) == 1.0
    assert calibration.fit_temperature(np.array([[1.0, 0.0]]), np.array([0])) == 1.0
    assert calibration.fit_temperature(np.array([[0.7, 0.3, 0.0]]), np.array([2])) == 1.0
    assert calibration.fit_temperature(np.zeros((0, 2)), np.zeros(0, dtype=int)) == 1.0
    assert low < calibration.fit_temperature(right, np.array([1, 1] * 5)) <= high


class _Summed:
    """Sums figures over ``n`` threads, as a data-parallel run's all-reduce does over its workers:
    each call waits for the others' (a thread that calls once more or less times out)."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=20)
        self.lock = threading.Lock()
        self.figures: list[float] | None = None
        self.done: list[float] = []

    def __call__(self, figures):
        with self.lock:
            self.figures = list(figures) if self.figures is None else [a + b for a, b in zip(self.figures, figures)]
        if self.barrier.wait() == 0:
            self.done, self.figures = self.figures, None
        self.barrier.wait()
        return list(self.done)


def test_shares_of_the_questions_find_the_temperature_of_all_of_them():
    """Each worker of a data-parallel run holds a share of the validation questions: one answers
    all of its own right, one holds none that tells; all find the temperature of the whole."""
    probs, gold = _drawn(np.random.default_rng(3), 600, 5)
    probs = calibration.scaled(probs, 2.0)
    right = probs.argmax(axis=1) == gold
    shares = [(probs[right][:100], gold[right][:100]),                     # every answer right
              (probs[100:], gold[100:]),
              (np.array([[1.0, 0.0, 0.0, 0.0, 0.0]] * 3), np.zeros(3, dtype=int))]   # nothing to tell
    whole = calibration.fit_temperature(np.concatenate([p for p, _ in shares]),
                                        np.concatenate([g for _, g in shares]))
    summed, found = _Summed(len(shares)), {}

    def fit(i: int) -> None:
        found[i] = calibration.fit_temperature(*shares[i], total=summed)

    threads = [threading.Thread(target=fit, args=(i,)) for i in range(len(shares))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert 0.3 < whole < 0.7                                     # softened: sharpen it again
    assert [found.get(i) for i in range(len(shares))] == pytest.approx([whole] * len(shares), rel=1e-9)
    assert calibration.fit_temperature(*shares[0]) == 1.0          # alone, the first share cannot tell


def test_an_ensemble_fits_its_temperature_on_valid_and_reports_it_on_test(tmp_path: Path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    files: list[dict[str, Path]] = [{}, {}]
    for split in ("valid", "test"):
        probs, gold = _drawn(rng, 600, 4)
        ids, words = [f"{split}{i}" for i in range(600)], [["a", "b", "c", "d"]] * 600
        for member, entry in enumerate(files):     # each member too unsure, and unsure of other questions
            noisy = probs * np.exp(rng.normal(scale=0.5, size=probs.shape))
            soft = calibration.scaled(noisy / noisy.sum(axis=1, keepdims=True), 1.5)
            entry[split] = write_member(tmp_path / f"{member}-{split}.parquet", ids, words, soft.tolist(), gold.tolist())
    result = averaging.run(files, ["a", "b"], tmp_path / "out")
    table = pq.read_table(result.predictions)
    valid = table.filter(pc.equal(table.column("split"), "valid"))
    mean, gold = np.array(valid.column("probs").to_pylist()), np.array(valid.column("gold").to_pylist())
    assert result.temperature == pytest.approx(calibration.fit_temperature(mean, gold))   # fitted on valid only
    assert result.temperature < 0.8                                                      # the average is unsure
    calibrated = np.array(table.column("calibrated_probs").to_pylist())
    assert calibrated == pytest.approx(calibration.scaled(np.array(table.column("probs").to_pylist()),
                                                          result.temperature))
    found = result.calibration
    assert found["calibrated_test_calibration_error"] < found["test_calibration_error"] / 2
    assert found["calibrated_test_log_loss"] < found["test_log_loss"]
    assert found["calibrated_valid_log_loss"] <= found["valid_log_loss"]

    plain = averaging.run(files, ["a", "b"], tmp_path / "plain", calibrate=False)
    assert plain.temperature == 1.0 and not any(k.startswith("calibrated_") for k in plain.calibration)
    again = pq.read_table(plain.predictions)
    assert again.column("calibrated_probs").to_pylist() == again.column("probs").to_pylist()


def test_the_calibration_benchmark_measures_the_temperature_on_held_out_questions(tmp_path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_calibration", Path(__file__).parents[1] / "benchmarks" /
                                                  "bench_calibration.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(2)
    probs, gold = _drawn(rng, 800, 4)
    files = []
    for member in range(3):
        noisy = probs * np.exp(rng.normal(scale=0.7, size=probs.shape))
        soft = calibration.scaled(noisy / noisy.sum(axis=1, keepdims=True), 1.5)
        files.append({"valid": write_member(tmp_path / f"{member}.parquet", [f"q{i}" for i in range(800)],
                                            [["a", "b", "c", "d"]] * 800, soft.tolist(), gold.tolist())})
    averaging.run(files, ["a", "b", "c"], tmp_path / "ens")
    bench.main([str(tmp_path / "ens"), "--repeats", "3", "--out", str(tmp_path / "found.json")])
    [found] = json.loads((tmp_path / "found.json").read_text())
    cross = found["valid_cross_fitted"]
    assert found["members"] == 3 and cross["questions"] == 800 and "test" not in found
    assert cross["scaled"]["calibration_error"] < 0.7 * cross["plain"]["calibration_error"]
    assert cross["scaled"]["log_loss"] < cross["plain"]["log_loss"]
    assert cross["scaled"]["accuracy"] == cross["plain"]["accuracy"]


def test_evaluate_reports_the_calibration_its_predictions_give(tmp_path: Path):
    import pyarrow.parquet as pq

    from _faults import invoke, make_checkpoint, make_prepared

    _, prepared = make_prepared(tmp_path)
    ckpt = make_checkpoint(prepared, tmp_path / "r.pt")
    out = tmp_path / "preds.parquet"
    code, output = invoke("evaluate", "--checkpoint", ckpt, "--data", prepared, "--split", "valid", "--out", out,
                          "--workdir", tmp_path / "work", "--json")
    assert code == 0, output
    result = json.loads(output.strip().splitlines()[-1])
    rows = pq.read_table(out).to_pylist()
    expected = calibration.of(calibration.padded([r["probs"] for r in rows]), np.array([r["gold"] for r in rows]))
    assert result["log_loss"] == pytest.approx(expected.log_loss, abs=1e-5)
    assert result["calibration_error"] == pytest.approx(expected.calibration_error, abs=1e-5)
    assert result["mean_confidence"] == pytest.approx(expected.mean_confidence, abs=1e-5)
    code, shown = invoke("evaluate", "--checkpoint", ckpt, "--data", prepared, "--split", "valid", "--out",
                         tmp_path / "again.parquet", "--workdir", tmp_path / "work")
    assert code == 0 and f"log-loss {expected.log_loss:.3f}" in shown, shown
    assert_says(shown, "calibration:", f"calibration error {100 * expected.calibration_error:.1f} points")


def test_evaluate_records_its_figures_on_the_run_that_names_the_checkpoint(tmp_path: Path):
    import mlflow

    from _faults import invoke, make_checkpoint, make_prepared, make_store

    _, prepared = make_prepared(tmp_path)
    ckpt = make_checkpoint(prepared, tmp_path / "r.pt")
    work = tmp_path / "work"

    def evaluate(split: str = "valid") -> dict:
        code, output = invoke("evaluate", "--checkpoint", ckpt, "--data", prepared, "--split", split, "--workdir",
                              work, "--json")
        assert code == 0, output
        return json.loads(output.strip().splitlines()[-1])

    def evaluate_at(run_dir: Path) -> dict:
        code, output = invoke("evaluate", "--checkpoint", run_dir / "checkpoints" / "best.pt", "--data", prepared,
                              "--split", "valid", "--workdir", work, "--json")
        assert code == 0, output
        return json.loads(output.strip().splitlines()[-1])

    assert "no MLflow store" in evaluate()["not_recorded"] and not (work / "mlflow.db").exists()   # none made
    db = make_store(work)
    assert_says(evaluate()["not_recorded"], "names this checkpoint or its run folder", "checkpoint and run_dir tags")
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    [run] = client.search_runs(client.search_experiments()[0].experiment_id)
    client.set_tag(run.info.run_id, "checkpoint", str(ckpt))
    found = evaluate()
    assert found["recorded_on_run"] == run.info.run_id and "not_recorded" not in found
    metrics = client.get_run(run.info.run_id).data.metrics
    assert metrics["evaluate/valid_acc"] == pytest.approx(found["accuracy"])
    assert metrics["evaluate/valid_log_loss"] == pytest.approx(found["log_loss"])
    assert metrics["evaluate/valid_calibration_error"] == pytest.approx(found["calibration_error"])
    assert metrics["valid_acc"] == 0.4                                   # the training's own series is untouched
    assert [a.path for a in client.list_artifacts(run.info.run_id, "evaluate")] == ["evaluate/predictions-valid.parquet"]
    assert client.get_run(run.info.run_id).info.status == "FINISHED"

    # a run stopped before its end has no checkpoint tag: its run folder names it
    stopped = make_checkpoint(prepared, tmp_path / "stopped" / "checkpoints" / "best.pt")
    client.set_tag(run.info.run_id, "run_dir", str(tmp_path / "stopped"))
    client.set_tag(run.info.run_id, "checkpoint", "elsewhere.pt")
    code, output = invoke("evaluate", "--checkpoint", stopped, "--data", prepared, "--split", "valid", "--workdir", work,
                          "--json")
    assert code == 0 and json.loads(output.strip().splitlines()[-1])["recorded_on_run"] == run.info.run_id, output
    assert len(client.get_metric_history(run.info.run_id, "evaluate/valid_acc")) == 2

    # the folder moved: its tracking.json names where it began; a copy beside its original is not its run
    import shutil

    from iaa.jobs.workdir.paths import RunFolder

    RunFolder(tmp_path / "stopped").track(f"sqlite:///{db}", run.info.run_id)
    (tmp_path / "stopped").rename(tmp_path / "moved")
    assert evaluate_at(tmp_path / "moved")["recorded_on_run"] == run.info.run_id
    (tmp_path / "moved").rename(tmp_path / "stopped")
    shutil.copytree(tmp_path / "stopped", tmp_path / "copy")
    assert "recorded_on_run" not in evaluate_at(tmp_path / "copy")
    assert len(client.get_metric_history(run.info.run_id, "evaluate/valid_acc")) == 3


def test_a_tracking_server_that_does_not_answer_leaves_the_evaluation_standing(tmp_path: Path, monkeypatch):
    from _faults import invoke, make_checkpoint, make_prepared

    monkeypatch.setenv("IAA_SERVICE_TIMEOUT_S", "1")
    _, prepared = make_prepared(tmp_path)
    ckpt = make_checkpoint(prepared, tmp_path / "r.pt")
    out = tmp_path / "preds.parquet"
    code, output = invoke("evaluate", "--checkpoint", ckpt, "--data", prepared, "--split", "valid", "--out", out,
                          "--tracking-uri", "http://127.0.0.1:9", "--workdir", tmp_path / "work", "--json")
    assert code == 0 and out.is_file(), output
    result = json.loads(output.strip().splitlines()[-1])
    assert_says(result["not_recorded"], "http://127.0.0.1:9", "could not be opened or searched")
    assert "recorded_on_run" not in result


def test_the_temperature_line_says_where_it_was_measured():
    from iaa.jobs.ensemble.ensemble_result import temperature_line

    valid = {"valid_calibration_error": 0.077, "calibrated_valid_calibration_error": 0.021, "valid_log_loss": 0.5,
             "calibrated_valid_log_loss": 0.4}
    test = {**valid, "test_calibration_error": 0.08, "calibrated_test_calibration_error": 0.03, "test_log_loss": 0.6,
            "calibrated_test_log_loss": 0.55}
    assert_says(temperature_line(0.62, test), "temperature:  0.62", "test calibration error 8.0 -> 3.0 points")
    assert "fitted to" not in temperature_line(0.62, test)
    assert_says(temperature_line(0.62, valid), "valid calibration error 7.7 -> 2.1", "the questions it was fitted to")
    assert_says(temperature_line(calibration.TEMPERATURES[0], valid), "the edge of the range searched")
    assert temperature_line(1.0, test) == "" and temperature_line(0.62, None) == ""
    assert_says(temperature_line(1.0, test, all_right=True), "not fitted", "every valid answer is right")
