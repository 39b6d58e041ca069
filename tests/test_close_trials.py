"""A sweep that cannot rank its best trials says so: the trials within chance of the best, and
the ensemble that trains them on several seeds, as its next command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from _faults import as_shown, assert_says
from iaa.jobs.evaluation import uncertainty
from iaa.jobs.reports import sweep_report
from tests._tiny import TINY_SETS, make_tiny_prepared


pytestmark = pytest.mark.timeout(300)


def test_the_chance_gap_of_two_scores_shrinks_with_the_questions():
    assert uncertainty.difference_half_width(0.9685, 0.9655, 2000) == pytest.approx(1.107, abs=0.001)
    assert uncertainty.difference_half_width(0.5, 0.5, 8000) == pytest.approx(
        uncertainty.difference_half_width(0.5, 0.5, 2000) / 2)
    assert uncertainty.difference_half_width(0.5, 0.5, 0) == float("inf")


def test_close_trials_are_those_chance_could_put_behind_the_best_closest_first():
    scores = {"a": 0.9685, "b": 0.9655, "c": 0.9285, "d": None, "e": 0.9600, "f": 0.9685}
    assert uncertainty.close_to_best(scores, 2000) == ["b", "e"]        # f ties (tied_best), c is 4 points behind
    assert uncertainty.close_to_best(scores, 200_000) == []
    assert uncertainty.close_to_best({"a": None}, 2000) == []
    note = uncertainty.close_note(["b", "e"], scores, "a", 2000, "run X")
    assert_says(note, "a (0.9685)", "b (0.9655), e (0.9600)", "2,000 questions", "up to 1.", "cannot tell", "; run X")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _tune(tiny: Path, tmp_path: Path, accuracies: list[float]):
    from fakes import FakeLauncher, FakeTracker
    from _platform import TINY_SPACE
    from iaa.jobs.tune import tune

    class Scored(FakeLauncher):
        def sweep(self, request):
            return [replace(r, best_valid_acc=acc) for r, acc in zip(super().sweep(request), accuracies)]

    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE, encoding="utf-8")
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=len(accuracies), search_space=space,
                           sets=TINY_SETS, workdir=tmp_path / "work", name="close", show_progress=False)
    tracker = FakeTracker()
    return tune.run(req, lambda uri: tracker, Scored()), tracker


def _record(tmp_path: Path):
    from iaa.jobs.sweeps import record

    return record.read(record.find(tmp_path / "work", "close"))


def _ensemble_step(result) -> str:
    return next(as_shown(c) for c in result.next if c.name == "ensemble")


def test_tune_names_the_trials_it_cannot_rank_and_ensembles_them_next(tiny, tmp_path, capsys, console):
    result, tracker = _tune(tiny, tmp_path, [0.25, 0.5, 0.1, 0.45])      # 64 valid questions: 5 points is chance
    err = as_shown(capsys.readouterr().err)
    best, close = result.best_trial, result.close_trials
    assert result.best_valid_acc == 0.5 and len(close) == 1 and close[0] != best
    assert result.tied_trials == (best,)
    assert_says(err, f"the best trial {best} (0.5000) leads {close[0]} (0.4500)", "64 questions",
                "--top-configs 2")
    assert "--top-configs 2" in _ensemble_step(result)
    parent = tracker.runs[result.parent_run_id]
    assert parent.tags["close_trials"] == close[0]
    assert_says(parent.tags["mlflow.note.content"], f"cannot tell it from {close[0]}")
    reported, note = sweep_report.close_trials(_record(tmp_path), tmp_path / "work")   # as `report --sweep` says it
    assert reported == close and "--top-configs 2" in as_shown(note) and note.startswith(f"the best trial {best}")
    gone = replace(_record(tmp_path), data_dir=str(tmp_path / "gone"))     # the split's size is unknown: no claim
    assert sweep_report.close_trials(gone, tmp_path / "work") is None


def test_a_clear_lead_keeps_the_plain_next_ensemble(tiny, tmp_path, capsys, console):
    result, tracker = _tune(tiny, tmp_path, [0.1, 0.9, 0.2])
    assert result.close_trials == () and "cannot tell" not in capsys.readouterr().err
    assert tracker.runs[result.parent_run_id].tags["close_trials"] == "none"
    assert sweep_report.close_trials(_record(tmp_path), tmp_path / "work") == ((), None)
    assert "--top-configs" not in _ensemble_step(result)


def test_many_close_trials_ensemble_at_most_three_configurations(tiny, tmp_path, capsys, console):
    result, _ = _tune(tiny, tmp_path, [0.5, 0.49, 0.48, 0.47, 0.46])
    assert len(result.close_trials) == 4
    assert "--top-configs 3" in _ensemble_step(result)
    assert_says(capsys.readouterr().err, "1 more")


# --- the ensemble of the K best configurations ranks them over their seeds --------------------------


def _trial(hidden: int) -> object:
    from iaa.jobs.config.job_config import JobConfig, apply
    from iaa.jobs.ports import TrialRecord

    cfg = apply(JobConfig(), {"model.hidden_dim": hidden})
    return TrialRecord(trial_id=f"t{hidden}", config=cfg, params={"model.hidden_dim": hidden})


def _seeded(trial, seeds):
    return [replace(trial.config, train=replace(trial.config.train, seed=s)) for s in seeds]


def test_configurations_are_ranked_by_their_mean_and_the_gap_weighed_by_the_seeds_spread():
    from iaa.jobs.ensemble import configurations

    a, b = _trial(64), _trial(32)
    members = _seeded(a, [0, 1, 2]) + _seeded(b, [0, 1, 2])
    ranked = configurations.scores(members, [0.60, 0.61, 0.62, 0.50, 0.52, 0.51], [a, b])
    assert [(c.config, c.label, c.seeds) for c in ranked] == [(0, "h=64", (0, 1, 2)), (1, "h=32", (0, 1, 2))]
    lead = configurations.lead(ranked)
    assert lead.first.config == 0 and lead.gap_points == pytest.approx(10.0)
    assert lead.stderr_points == pytest.approx(100 * (2 * 0.01 ** 2 / 3) ** 0.5) and lead.apart
    assert_says(configurations.lines(ranked, lead), "config0 (h=64): mean valid accuracy 0.6100 over 3 seed(s)",
                "config0 leads config1 by 10.00 points", "the seeds rank it first")

    close = configurations.scores(members, [0.60, 0.50, 0.54, 0.56, 0.52, 0.57], [a, b])
    lead = configurations.lead(close)
    assert lead.first.config == 1 and not lead.apart                # the runner-up by the sweep leads, within the spread
    assert_says(configurations.lines(close, lead), "config1 leads config0", "cannot rank them either")
    single = configurations.scores(_seeded(a, [0]) + _seeded(b, [0]), [0.6, 0.5], [a, b])
    assert configurations.lead(single) is None
    assert_says(as_shown(configurations.lines(single, None)), "--seeds 3 or more")


def test_ensemble_of_two_configurations_records_each_over_its_seeds(tiny, tmp_path, capsys, console):
    import json

    from fakes import FakeLauncher, FakeTracker
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
    from iaa.jobs.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text("model.hidden_dim: [8, 12]\n", encoding="utf-8")
    tracker, launcher, work = FakeTracker(), FakeLauncher(), tmp_path / "work"
    tune.run(tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=2, search_space=space, sets=TINY_SETS,
                              workdir=work, name="two", show_progress=False), lambda uri: tracker, launcher)
    capsys.readouterr()
    result = ensemble.run(EnsembleRequest(sweep="two", data=tiny, top_configs=2, seeds=2, workdir=work,
                                          show_progress=False), tracker, launcher)
    configs = result.configurations
    assert [len(c["seeds"]) for c in configs] == [2, 2] and {c["label"] for c in configs} == {"h=8", "h=12"}
    assert sorted(a for c in configs for a in c["valid_acc"]) == pytest.approx(sorted(result.member_valid_acc))
    assert all(c["mean_valid_acc"] == pytest.approx(sum(c["valid_acc"]) / 2) for c in configs)
    assert set(result.configuration_lead) == {"first", "second", "gap_points", "stderr_points", "apart"}
    on_disk = json.loads((Path(result.ensemble_dir) / "ensemble.json").read_text())
    assert on_disk["configurations"] == list(configs) and on_disk["configuration_lead"] == result.configuration_lead
    assert_says(capsys.readouterr().err, "configurations over their seeds:", "over 2 seed(s)",
                f"valid log-loss {result.calibration['valid_log_loss']:.3f} (members "
                f"{result.calibration['mean_member_valid_log_loss']:.3f} on average)")
    assert on_disk["calibration"] == result.calibration
    assert "configurations" not in ensemble.run(EnsembleRequest(
        sweep="two", data=tiny, top_configs=1, seeds=2, workdir=work, name="one-config", show_progress=False),
        tracker, launcher).fields()


def test_tied_and_close_trials_all_go_to_the_ensemble_up_to_three():
    from iaa.jobs.sweeps.ranking import Ranking

    ranking = Ranking.of({"a": 0.5, "b": 0.5, "c": 0.49, "d": 0.1}, 64)
    assert ranking.ties == ("a", "b") and ranking.close == ("c",) and ranking.top_configs == 3
    assert Ranking.of({"a": 0.9, "b": 0.1}, 2000).top_configs == 1
    assert Ranking.of({"a": 0.5, "b": 0.49, "c": 0.48, "d": 0.47}, 64).top_configs == 3
