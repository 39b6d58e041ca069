"""What a sweep shows: run names, the parent run's params, the next commands (no Ray, no MLflow)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from _faults import as_shown, assert_says
from fakes import sweep_plan
from iaa.jobs.config import search_space
from iaa.jobs.tune import tune
from iaa.jobs.config.job_config import JobConfig
from iaa.jobs.ports import Placement, SearchPlan, StudyAnalysis, StudyTrial, trial_name
from iaa.jobs.config.presets import TUNE_PRESETS
from iaa.jobs.config.job_config import config_label
from iaa.jobs.ports import TrialRecord


def test_run_names_show_the_searched_values_short_and_in_the_papers_order() -> None:
    assert config_label({"model.hidden_dim": 64, "model.steps": 2, "train.lr": 0.004}) == "lr=4e-3 T=2 h=64"
    assert config_label({"train.lr": 0.00125, "model.dropout": 0.2}) == "lr=1.25e-3 dropout=0.2"
    assert config_label({"train.lr": 0.05}) == "lr=0.05"


def test_the_parent_run_logs_the_search_space_not_a_presets_value_of_a_searched_key(tmp_path: Path) -> None:
    base = JobConfig()
    space = search_space.parse(search_space.DEMO_GRID, base)
    plan = SearchPlan(base=base, space=space, preset=TUNE_PRESETS["demo"], seed=0, num_samples=4, max_t=4,
                      study_storage="sqlite:///x.db", study_name="demo-iaa-abc123")
    launch = Placement(name="demo-iaa-abc123", storage=str(tmp_path), prepared=tmp_path, max_concurrent=2,
                       threads=1, gpus_per_worker=0.0, train_rows=100)
    params = tune.sweep_params(plan, 1, launch)
    for key in space.params:
        head, leaf = key.split(".")
        assert leaf not in params[head]                       # no single value for what is searched
        assert params[f"search.{key}"] == space.params[key].describe()
    assert params["train"]["seed"] == base.train.seed         # what every trial shares stays
    assert params["tune.study"] == "demo-iaa-abc123" and params["tune.num_samples"] == 4
    assert params["tune.sampler"] == "tpe"                     # the plan's sampler, by default
    assert (params["tune.max_checks"], params["tune.asha_max_t"]) == (3, 4)   # the checks a trial makes, as said
    assert tune.sweep_params(replace(plan, sampler="cmaes"), 1, launch)["tune.sampler"] == "cmaes"


def test_the_summary_ends_with_the_next_commands() -> None:
    best = TrialRecord(trial_id="t1", config=JobConfig(), checkpoint="/w/best.pt")
    text = as_shown(tune.next_commands(sweep_plan(Path("/w")), best, Path("/w/best.yaml")))
    assert text.splitlines()[1:] == ["  iaa-cli train --config /w/best.yaml",
                                     "  iaa-cli report --sweep demo-iaa-abc123",
                                     "  iaa-cli ensemble --sweep demo-iaa-abc123",
                                     "  iaa-cli serve --checkpoint /w/best.pt"]


def test_a_parameter_that_never_varied_and_too_few_trials_are_said() -> None:
    from iaa.jobs.config import exploration

    trials = [{"train.lr": 4e-3, "model.steps": s} for s in (2, 3, 2, 3)]
    notes = exploration.notes(trials, ["train.lr", "model.steps"])
    assert notes[0].startswith("train.lr never varied (every scored trial tried 0.004)")
    assert not any(n.startswith("model.steps") for n in notes)
    assert notes[-1].startswith("4 scored trial(s) are too few to rank parameter importances")
    many = [{"train.lr": lr, "model.steps": 2 + i % 2} for i, lr in enumerate([1e-3, 2e-3] * 6)]
    assert exploration.notes(many, ["train.lr", "model.steps"]) == []


def test_trials_that_cannot_separate_the_parameters_that_varied_are_said_once() -> None:
    from iaa.jobs.config import exploration

    params = ["train.lr", "model.steps", "model.hidden_dim"]
    two = [{"train.lr": 2e-3, "model.steps": 3, "model.hidden_dim": 32}, {"train.lr": 4e-3, "model.steps": 2, "model.hidden_dim": 64}]
    assert not exploration.separable(two, params)
    (note,) = exploration.notes(two, params)
    assert_says(note, "2 scored trials cannot separate the effects of the 3 parameters", "need 4 or more")
    four = two + [{"train.lr": 2e-3, "model.steps": 2, "model.hidden_dim": 64}, {"train.lr": 4e-3, "model.steps": 3, "model.hidden_dim": 32}]
    assert exploration.separable(four, params)
    assert_says(exploration.notes(four, params)[-1], "read them as a sketch")
    (alone,) = exploration.notes(two[:1], params)        # not one line per parameter that a lone trial held
    assert_says(alone, "1 scored trial(s): no two trials were compared")


def _analysis(trials: list[StudyTrial], **fields) -> StudyAnalysis:
    """The analysis of study ``s`` of ``trials`` that drew nothing, but for ``fields``."""
    return StudyAnalysis(**{"study": "s", "storage": "sqlite:///x.db", "importances": {},
                            "importance_evaluator": "fANOVA", "dashboard_importances": {}, "scored_trials": 0,
                            "complete_trials": 0, "best": None, "history": (), "carried_trials": 0,
                            "carried_best": None, "trials": tuple(trials), "figures": {}, **fields})


def test_report_describe_leaves_the_warnings_to_the_console() -> None:
    from iaa.jobs.reports import sweep_report

    trials = [StudyTrial(number=n, name=trial_name(n), state="", params={}, value=None, intermediate_values={})
              for n in range(4)]
    result = sweep_report.from_analysis(_analysis(trials, importances={"train.lr": 0.0}), sweep="s",
                                        warnings=("train.lr never varied",))
    assert result.warnings == ("train.lr never varied",) and "never varied" not in sweep_report.describe(result)


def _trial(number: int, checks: list[float], state: str = "COMPLETE", **extra) -> StudyTrial:
    return StudyTrial(number=number, name=trial_name(number), state=state, params={}, value=max(checks),
                      intermediate_values=dict(enumerate(checks, start=1)), stopped_by_asha=state == "PRUNED", **extra)


def test_report_says_how_the_trials_asha_let_go_on_ended_against_its_first_comparison() -> None:
    from iaa.jobs.reports import sweep_report

    def report(trials: list[StudyTrial], grace: int | None = 1) -> sweep_report.SweepReportResult:
        return sweep_report.from_analysis(_analysis(trials), sweep="s", grace_period=grace)

    stopped = [_trial(0, [0.30], "PRUNED"), _trial(1, [0.28], "PRUNED")]
    in_order = [_trial(2, [0.40, 0.50, 0.60]), _trial(3, [0.38, 0.45, 0.55]), _trial(4, [0.35, 0.41, 0.52])]
    result = report(stopped + in_order + [_trial(5, [0.9, 0.95], carried_from="earlier")])
    assert result.first_comparison == {"check": 1, "compared": 5, "stopped": 2, "went_on": 3, "spearman": 1.0}
    assert_says(sweep_report.describe(result), "ASHA first compared 5 trials at check 1 and stopped 2 there",
                "correlates 1.00")
    assert result.warnings == ()
    alone = report([_trial(2, [0.40, 0.50])])                   # one trial reached the check: no comparison
    assert alone.first_comparison["compared"] == 1 and "ASHA first compared" not in sweep_report.describe(alone)

    # the leaders at check 1 ended last: the check ranked them by chance or worse
    upside_down = [_trial(2, [0.40, 0.42, 0.45]), _trial(3, [0.38, 0.45, 0.55]), _trial(4, [0.35, 0.50, 0.60])]
    [warning] = report(stopped + upside_down).warnings
    assert_says(warning, "ranked the 3 trials that went on past it poorly", "Spearman -1.00", "iaa-cli tune `grace_period` 2")

    assert report(stopped + in_order[:2]).first_comparison["spearman"] is None      # too few went on to rank
    assert report(stopped + in_order, grace=None).first_comparison is None           # a sweep that kept no ASHA
    assert sweep_report.comparison_line(report(in_order, grace=5)) == []             # no trial reached check 5


def test_the_runs_line_opens_a_servers_view_once() -> None:
    from iaa.jobs.tune.best import runs_line

    view = "http://mlflow:5000/#/experiments/1/runs?viewStateShareKey=iaa-sweep"
    assert runs_line("open http://mlflow:5000", view) == f"open {view}"
    local = "mlflow ui --backend-store-uri sqlite:////w/mlflow.db"
    assert runs_line(local, view) == f"{local}  (then open {view})"
    assert runs_line(local, None) == local
