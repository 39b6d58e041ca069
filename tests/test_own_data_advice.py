"""The own-data path: make-cloze says where the text's sentences went and what to run next, and
every command that path advises (in its summary and in its errors) runs as printed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from _faults import as_shown, assert_says
from iaa.cli import cli
from iaa.data.cloze.sources import SourceSpec
from iaa.data.cloze.tagging import tag_units
from iaa.jobs.own_data import cloze_summary, make_cloze
from tests._cloze_fake import book, make_fake


def _books(tmp_path: Path, n: int = 6) -> Path:
    path = tmp_path / "src" / "books.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(book(f"Book {i}", 60, seed=i) for i in range(n)), encoding="utf-8")
    return path


def _make(tmp_path: Path, style: str = "cbt-ne", valid: int = 1) -> make_cloze.ClozeResult:
    cfg = make_cloze.ClozeConfig(style, (SourceSpec.parse(str(_books(tmp_path))),), valid=valid, test=1, seed=3)
    return make_cloze.run(cfg, tmp_path / "own-cloze", workers=0, tagger=make_fake, progress=False)


@pytest.fixture
def local_tagging(monkeypatch):
    """make-cloze as printed (spaCy on Ray) runs with the rule-based tagger in this process."""
    from iaa.platform import cloze_ray

    monkeypatch.setattr(make_cloze, "check_pipeline", lambda name: None)
    monkeypatch.setattr(make_cloze, "spacy_factory", lambda name, needs: make_fake)
    monkeypatch.setattr(cloze_ray, "tag", lambda units, factory, **kw: tag_units(factory(), units))


def _run(command: str):
    words = shlex.split(command)
    assert words[0] == "iaa-cli", command
    return CliRunner().invoke(cli, words[1:])


def _advice(output: str) -> list[str]:
    """The commands the error line advises, each up to the ", " or "; " that ends it."""
    line = next((line for line in output.splitlines() if line.startswith("Error:")), "")
    return [f"iaa-cli {re.split(r'[,;] ', part, maxsplit=1)[0].strip()}" for part in line.split("iaa-cli ")[1:]]


def test_the_funnel_counts_what_each_filter_dropped(tmp_path):
    result = _make(tmp_path)
    total = sum(result.questions.values())
    assert result.sentences > 0 and result.windows >= total
    assert sum(v for k, v in result.dropped.items() if k != "short_documents") == result.windows - total
    text = cloze_summary.describe(result)
    assert f"{result.windows} windows tried" in text and "next:" in text


def test_few_questions_are_explained():
    result = make_cloze.ClozeResult(
        style="cbt-ne", out="/x/own", questions={"train": 40, "valid": 6, "test": 6},
        documents={"train": 8, "valid": 1, "test": 1}, sentences=2000, windows=1800,
        dropped={"too_few_candidates": 1500, "no_answer_in_context": 248, "short_documents": 2},
        skipped_documents=2, tokens=0, tagging_seconds=0.0, tokens_per_s=0, seconds=0.0)
    text = cloze_summary.describe(result)
    assert_says(text, "1500 windows dropped", "fewer than 9 other named-entity nouns")
    assert "2 documents dropped" in text and "few questions: 3% of the windows" in text and "cbt-cn" in text


def test_make_cloze_next_commands_run_as_printed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _make(tmp_path)
    commands = [line.strip() for line in as_shown(cloze_summary.describe(result)).split("next:\n")[1].splitlines()]
    assert commands[0].startswith("iaa-cli prepare")
    res = _run(commands[0])
    assert res.exit_code == 0, res.output
    for command in commands[1:]:                # tune and train: accepted (parsed), not run to the end
        words = shlex.split(command)
        cli.commands[words[1]].make_context(words[1], words[2:])
        assert Path(words[words.index("--data") + 1]).is_dir()


def test_tune_on_the_question_folder_advises_a_prepare_that_runs(tmp_path):
    _make(tmp_path)
    res = CliRunner().invoke(cli, ["tune", "--data", str(tmp_path / "own-cloze"), "--workdir", str(tmp_path / "w")])
    assert res.exit_code != 0
    advice = _advice(res.output)
    assert advice and "--out" in advice[0], res.output
    done = _run(advice[0])
    assert done.exit_code == 0, done.output
    prepared = re.search(r"then give --data (\S+)", res.output).group(1)
    assert (Path(prepared) / "manifest.json").is_file()


def test_an_empty_valid_split_advises_commands_that_run(tmp_path, local_tagging):
    result = _make(tmp_path, valid=0)
    assert result.questions.get("valid", 0) == 0
    prepared = tmp_path / "own-cloze-prepared"
    assert _run(f"iaa-cli prepare --dataset cbt-ne --source {tmp_path / 'own-cloze'} --out {prepared}").exit_code == 0
    res = CliRunner().invoke(cli, ["train", "--data", str(prepared), "--workdir", str(tmp_path / "w")])
    assert res.exit_code != 0
    advice = _advice(res.output)
    assert [a.split()[1] for a in advice] == ["make-cloze", "prepare"], res.output
    for command in advice:
        done = _run(command)
        assert done.exit_code == 0, (command, done.output)
    import json

    assert json.loads((prepared / "manifest.json").read_text())["counts"]["valid"] > 0
