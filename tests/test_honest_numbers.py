"""Every accuracy a command prints carries its split size and 95% interval and says when a
comparison is noise; every command ends with a rounded summary, its stop reason in words and next
commands that run as printed."""

from __future__ import annotations

import json
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from _faults import as_shown, assert_says
from iaa.cli import cli
from iaa.jobs.evaluation import closing, uncertainty
from iaa.jobs.evaluation.ensembling.ensemble_record import EnsembleRecord
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _sets(*extra: str) -> list[str]:
    return [a for s in [*TINY_SETS, "train.threads=1", *extra] for a in ("--set", s)]


def _next(output: str) -> list[str]:
    tail = output.split("next:\n", 1)[1]
    return [line.strip() for line in tail.splitlines() if line.startswith("  iaa-cli ")]


# --- the shared helper --------------------------------------------------------------------------------


def test_standard_error_is_binomial():
    assert uncertainty.standard_error(0.2, 5) == pytest.approx(math.sqrt(0.2 * 0.8 / 5))
    assert uncertainty.standard_error(0.7, 2000) == pytest.approx(0.010247, abs=1e-6)
    assert math.isnan(uncertainty.standard_error(0.5, 0))


def test_a_wide_interval_is_called_noise_and_a_narrow_one_is_not():
    assert "noise" in uncertainty.accuracy_text(0.2, 5)
    assert "noise" in uncertainty.accuracy_text(1.0, 2)       # a perfect score on 2 questions says nothing
    assert "noise" not in uncertainty.accuracy_text(0.7, 2000)
    assert uncertainty.accuracy_text(0.2, 5).startswith("0.2000 (95% interval 0.0362 to 0.6245, n=5")
    assert uncertainty.is_noise(0.5, 300) and not uncertainty.is_noise(0.5, 500)


def test_an_error_bar_is_a_wilson_interval_never_zero_wide():
    """A perfect (or null) score on 2,000 questions still has a 95% interval, and says its count."""
    for p in (0.0, 1.0, 0.003, 0.6, 0.9995):
        low, high = uncertainty.wilson_interval(p, 2000)
        assert low <= p <= high and high - low > 0.001, (p, low, high)
    perfect = uncertainty.accuracy_text(1.0, 2000)
    assert "0 errors in 2,000" in perfect and "0.9981 to 1.0000" in perfect and "± 0.0000" not in perfect
    assert "0 correct in 2,000" in uncertainty.accuracy_text(0.0, 2000)
    assert uncertainty.accuracy_text(0.855, 2000).startswith("0.8550 ± 0.0154 (n=2000")     # 1.96 SE, about
    assert uncertainty.half_width_points(1.0, 2000) > 0


def test_a_tie_is_named():
    ties = uncertainty.tied_best({"a": 0.2, "b": 0.2, "c": 0.1, "d": None, "e": 0.20000001})
    assert ties == ["a", "b", "e"]
    note = uncertainty.tie_note(ties, "a", 0.2, 5)
    assert note.startswith("3 trials tie") and "b, e did as well" in note and "noise" in note


def test_stop_reason_in_words_says_when_still_improving():
    improving = {"reason": "max-epochs", "steps": 24, "best_step": 24}
    assert "while still improving" in closing.stop_words(**improving, epochs=2.0)
    assert "--resume and --set train.max_epochs=4" in as_shown(closing.stop_words(**improving, epochs=2.0, checks=6))
    plateau = {"reason": "max-epochs", "steps": 24, "best_step": 12}
    assert "improving" not in closing.stop_words(**plateau, epochs=2.0)
    assert "improving" not in closing.stop_words(**improving, epochs=2.0, checks=1)   # one check improved on nothing
    assert "patience" in closing.stop_words("early-stopped", steps=9, best_step=3)


# --- train and evaluate through the CLI ---------------------------------------------------------------


def test_train_ends_with_a_rounded_summary_and_next_commands_that_run(tiny, tmp_path, monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "IAA_WORKDIR", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)                         # a next command without --workdir would write here
    work = tmp_path / "work"
    res = CliRunner().invoke(cli, ["train", "--data", str(tiny), "--workdir", str(work), *_sets()])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "best valid accuracy" in out and "95%" in out and "n=64" in out and "noise" in out
    assert "stopped at max-epochs" in out or "stopped early" in out
    assert "lr: " not in out and "train_examples_per_s" not in out      # no raw dump of every metric
    commands = _next(out)
    assert [c.split()[1] for c in commands] == ["evaluate", "explain", "serve"]
    for command in commands[:2]:
        done = CliRunner().invoke(cli, shlex.split(command)[1:] + (["--out", str(tmp_path / "e.html")]
                                                                    if "explain" in command else []))
        assert done.exit_code == 0, (command, done.output)
        if "evaluate" in command:
            assert "95%" in done.output and "n=64" in done.output and "next:" in done.output
            assert "recorded:     on MLflow run" in done.output    # on the run, in the work folder's store
            for line in _next(done.output):                 # and its own next commands keep the folder
                assert f"--workdir {work}" in line, line
    assert list((work / "evaluations").glob("*/predictions-*.parquet")) and not (tmp_path / "iaa-work").exists()
    again = CliRunner().invoke(cli, ["train", "--data", str(tiny), "--workdir", str(work), "--overwrite", "--json",
                                     *_sets()])
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert {"checkpoint", "best_valid_acc", "stop_reason", "lr", "baseline_valid_acc"} <= set(result)
    assert result["valid_examples"] == result["best_valid_acc_n"] == 64
    assert result["best_valid_acc_stderr"] == pytest.approx(
        uncertainty.standard_error(result["best_valid_acc"], 64), abs=1e-6)


# --- tune: ties and error bars ------------------------------------------------------------------------


def test_tune_names_a_tie_and_gives_the_error_bar(tiny, tmp_path, capsys, console):
    sys.path.insert(0, str(Path(__file__).parent))
    from fakes import FakeLauncher, FakeTracker
    from _platform import TINY_SPACE
    from iaa.jobs.tune import tune

    class TiedLauncher(FakeLauncher):
        def sweep(self, request):
            return [replace(r, best_valid_acc=0.25) for r in super().sweep(request)]

    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE, encoding="utf-8")
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=3, search_space=space, sets=TINY_SETS,
                           workdir=tmp_path / "work", name="tied", show_progress=False)
    result = tune.run(req, lambda uri: FakeTracker(), TiedLauncher())
    err = capsys.readouterr().err
    assert len(result.tied_trials) == 3 and "3 trials tie" in err
    assert_says(err, "valid accuracy 0.2500", "95% interval 0.1601 to 0.3682", "n=64", "noise")
    assert result.best_valid_acc_n == 64 and result.best_valid_acc_stderr == pytest.approx(0.054127, abs=1e-5)


# --- ensemble and distill -------------------------------------------------------------------------------


def test_ensemble_states_its_cost_first_and_its_accuracy_with_error_bars(tiny, tmp_path, capsys, console):
    sys.path.insert(0, str(Path(__file__).parent))
    from fakes import FakeTracker
    from tests._explain import tiny_checkpoint
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest

    members = tuple(tiny_checkpoint(tiny, tmp_path / f"m{s}.pt", seed=s) for s in range(2))
    req = EnsembleRequest(members=members, data=tiny, workdir=tmp_path / "work", show_progress=True)
    summary = ensemble.run(req, FakeTracker())
    err = capsys.readouterr().err
    assert err.index("scoring 2 members on valid (64 questions) and test (64 questions)") < err.index("evaluate members")
    assert "256/256" in err                                          # the bar counts questions, not files
    assert summary.valid_acc_n == 64 and summary.valid_acc_stderr is not None
    assert "n=64" in err and "the best)" in err and "next:" in err


def test_the_summary_gives_the_best_checks_step_and_epoch_and_the_runs_end():
    from iaa.jobs.training import summary

    early = summary.TrainResult(best_valid_acc=0.4, best_step=120, steps=360, epoch=0.576, stop_reason="early-stopped",
                                checkpoint="c.pt", run_dir="r", metrics={"step": 360})
    assert_says(summary.describe(early), "at step 120 (epoch 0.192) of 360 (epoch 0.576); stopped early")


def test_distill_compares_the_student_with_its_ensemble_and_best_member():
    from iaa.jobs.distill import outcome

    kept = outcome.comparison(0.56, EnsembleRecord(members=(), valid_acc=0.60, member_valid_acc=(0.50, 0.52)))
    assert kept == {"teacher_valid_acc": 0.60, "best_member_valid_acc": 0.52, "gain_points": 8.0,
                    "gain_kept_points": 4.0}
    no_gain = EnsembleRecord(members=(), valid_acc=0.5, member_valid_acc=(0.55,))
    assert outcome.comparison(0.5, no_gain)["gain_kept_points"] is None
    text = outcome.describe(_distilled(kept, 0.56))
    assert_says(text, "teacher:", "ensemble of 2 members", "valid accuracy 0.6000 ± 0.0215", "(n=2000, 95%)")
    assert "4.0 points above" in text and "kept 4.0 of the ensemble's 8.0 points" in text and "next:" in text
    assert "noise" not in text


def _distilled(comparison: dict, student: float):
    from dataclasses import replace

    from iaa.jobs.distill import outcome
    from iaa.jobs.training.summary import next_commands

    result = outcome.DistillResult(
        **comparison, best_valid_acc=student, valid_examples=2000, stop_reason="early-stopped", steps=30,
        best_step=20, epoch=3.0, checkpoint="/r/best.pt", run_dir="/r", data_dir="/d", members=("a", "b"),
        baseline_valid_acc=0.3, teacher="/t.parquet", teacher_computed=True, dataset="cbt-ne")
    return replace(result, next=next_commands(result))


def test_distill_says_in_points_when_the_student_kept_none_of_a_small_gain():
    """A student far below the best member of an ensemble barely above it kept none of the gain:
    no share of the gain (-2237%), no signed distance (-51.4 points from it)."""
    from iaa.jobs.distill import outcome

    kept = outcome.comparison(0.40, EnsembleRecord(members=(), valid_acc=0.937, member_valid_acc=(0.914, 0.90)))
    assert kept["gain_points"] == pytest.approx(2.3) and kept["gain_kept_points"] == 0
    text = outcome.describe(_distilled(kept, 0.40))
    assert "kept none of that gain" in text and "51.4 points below" in text
    assert "%" not in text.split("best member:")[1].split("next:")[0] and "-51" not in text
    commands = text.split("next:\n")[1]
    assert "iaa-cli evaluate" in commands and "iaa-cli serve" in commands and "iaa-cli ensemble" not in commands
