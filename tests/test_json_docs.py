"""docs/json.md lists every key of every command's ``--json`` object, so it cannot drift from the
results: each key that a result's ``fields()`` can print is documented in its command's section,
in the printed order, and every key documented there is one the result has (or one of a training
run's ``spread()`` figures, checked against the training loop); ``absent_when_none()`` keys are
said to be sometimes absent; the nested records' tables match their classes; each example is
JSON whose keys are documented; and the failure and stop objects are those ``iaa/cli/output.py``
prints.

The page is parsed simply: under each ``## COMMAND`` heading, the rows of the table whose first
column is ``key`` (``key | type | meaning | present``), and under each ``### `PATH` `` heading the
table whose first column is ``item key``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from iaa.jobs.datasets.prepare import PrepareResult
from iaa.jobs.distill.outcome import DistillResult
from iaa.jobs.ensemble import configurations
from iaa.jobs.ensemble.ensemble_result import EnsembleResult
from iaa.jobs.evaluation import result as result_module
from iaa.jobs.evaluation.evaluate import EvaluateResult
from iaa.jobs.evaluation.explaining.explain import ExplainResult
from iaa.jobs.evaluation.explaining.explained import ExplainedExample, ExplainedStep
from iaa.jobs.evaluation.frequency import BaselineResult
from iaa.jobs.inference.predict import PredictResult
from iaa.jobs.own_data.cloze_summary import ClozeResult
from iaa.jobs.ports import BestTrial, HistoryPoint, StudyTrial
from iaa.jobs.reports.report import Curve, ReportResult
from iaa.jobs.reports.sweep_list import SweepListResult, SweepSummary
from iaa.jobs.reports.sweep_report import SweepReportResult
from iaa.jobs.sweeps import comparison
from iaa.jobs.train.bench import BenchResult
from iaa.jobs.training import loop
from iaa.jobs.training.summary import NAMED, TrainResult
from iaa.jobs.tune.best import TuneResult

DOC = Path(__file__).resolve().parents[1] / "docs" / "json.md"

# Each command's section heading in docs/json.md, and the result its job returns.
COMMANDS: dict[str, type] = {
    "prepare": PrepareResult,
    "train": TrainResult,
    "evaluate": EvaluateResult,
    "baseline": BaselineResult,
    "tune": TuneResult,
    "ensemble": EnsembleResult,
    "distill": DistillResult,
    "explain": ExplainResult,
    "predict": PredictResult,
    "report --experiment": ReportResult,
    "report --sweep": SweepReportResult,
    "report --sweeps": SweepListResult,
    "bench": BenchResult,
    "make-cloze": ClozeResult,
}
# A section that documents only the keys its result adds to another's: distill's object is
# train's keys, in the same order, then its own.
INHERITS = {"distill": "train"}

# The field kinds that shape the JSON object (the metadata key of each helper's field).
SPREAD = next(iter(result_module.spread().metadata))
ABSENT = next(iter(result_module.absent_when_none().metadata))
HIDDEN = next(iter(result_module.hidden().metadata))


def _lead() -> configurations.Lead:
    first = configurations.ConfigScores(0, "a", (0, 1), (0.5, 0.6))
    second = configurations.ConfigScores(1, "b", (0, 1), (0.4, 0.5))
    return configurations.Lead(first, second, 10.0, 5.0)


def _dataclass_keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# The nested records' tables (section, ### path): the keys each holds, in order.
NESTED: dict[tuple[str, str], Any] = {
    ("explain", "examples[]"): lambda: _dataclass_keys(ExplainedExample),
    ("explain", "examples[].trace[]"): lambda: _dataclass_keys(ExplainedStep),
    ("report --experiment", "runs[]"): lambda: _dataclass_keys(Curve),
    ("report --sweep", "trials[]"): lambda: _dataclass_keys(StudyTrial),
    ("report --sweep", "history[]"): lambda: _dataclass_keys(HistoryPoint),
    ("report --sweep", "best"): lambda: _dataclass_keys(BestTrial),
    ("report --sweep", "first_comparison"): lambda: list(comparison.first_comparison([], 1)),
    ("report --sweeps", "sweeps[]"): lambda: _dataclass_keys(SweepSummary),
    ("ensemble", "configurations[]"): lambda: list(_lead().first.fields()),
    ("ensemble", "configuration_lead"): lambda: list(_lead().fields()),
}


# --- the page, parsed ------------------------------------------------------------------------------

@dataclasses.dataclass
class Table:
    path: str | None                # the ``### `PATH` `` heading it is under; None: the section's own
    header: list[str]
    rows: list[dict[str, str]]

    @property
    def keys(self) -> list[str]:
        return [row[self.header[0]] for row in self.rows]


@dataclasses.dataclass
class Section:
    title: str
    tables: list[Table]
    examples: list[str]             # the text of each ```json block

    @property
    def rows(self) -> list[dict[str, str]]:
        """The rows of its key tables (first column ``key``), in order."""
        return [row for t in self.tables if t.path is None and t.header[0] == "key" for row in t.rows]

    @property
    def keys(self) -> list[str]:
        return [row["key"] for row in self.rows]

    def nested(self) -> dict[str, Table]:
        return {t.path: t for t in self.tables if t.path is not None and t.header[0] == "item key"}


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("`").strip() for cell in line.strip().strip("|").split("|")]


def parse(text: str) -> dict[str, Section]:
    """The page's ``## `` sections, each with its tables and its JSON examples."""
    sections: dict[str, Section] = {}
    lines = text.splitlines()
    current: Section | None = None
    path: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), Section(line[3:].strip(), [], []))
            path = None
        elif line.startswith("### ") and current is not None:
            quoted = re.findall(r"`([^`]+)`", line)
            path = quoted[0] if quoted else line[4:].strip()
        elif line.startswith("```json") and current is not None:
            end = lines.index("```", i + 1)
            current.examples.append("\n".join(lines[i + 1:end]))
            i = end
        elif (line.startswith("|") and current is not None and i + 1 < len(lines)
              and re.match(r"^\|[-| :]+\|$", lines[i + 1].strip())):
            header = [h.lower() for h in _cells(line)]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = _cells(lines[i])
                assert len(cells) == len(header), f"docs/json.md: a row of {len(cells)} cells: {lines[i]}"
                rows.append(dict(zip(header, cells)))
                i += 1
            current.tables.append(Table(path, header, rows))
            continue
        i += 1
    return sections


@pytest.fixture(scope="module")
def page() -> dict[str, Section]:
    return parse(DOC.read_text(encoding="utf-8"))


# --- what a result can print -----------------------------------------------------------------------

def printed(cls: type) -> list[tuple[str, str]]:
    """The fields whose values ``fields()`` can print, in its order, each with its kind:
    ``spread`` (its items are keys), ``absent`` (no key when None) or ``plain``. Hidden fields
    and ``next`` print nothing."""
    found = []
    for f in dataclasses.fields(cls):
        if f.metadata.get(HIDDEN) or f.name == "next":
            continue
        kind = "spread" if f.metadata.get(SPREAD) else "absent" if f.metadata.get(ABSENT) else "plain"
        found.append((f.name, kind))
    return found


def own_fields(cls: type, parent: type) -> list[tuple[str, str]]:
    inherited = {name for name, _ in printed(parent)}
    return [(name, kind) for name, kind in printed(cls) if name not in inherited]


def problems(title: str, cls: type, sections: dict[str, Section], parent: type | None = None) -> list[str]:
    """What docs/json.md's section ``title`` gets wrong about the keys of ``cls`` (those of
    ``parent`` aside, which another section documents); [] when nothing."""
    section = sections.get(title)
    if section is None:
        return [f"docs/json.md has no section `## {title}` for {cls.__name__}"]
    fields = printed(cls) if parent is None else own_fields(cls, parent)
    rows = section.rows
    if not rows:
        return [f"docs/json.md `## {title}` has no table of keys (| key | type | meaning | present |)"]
    said = {row["key"]: row for row in rows}
    found: list[str] = []
    for key in {row["key"] for row in rows if sum(r["key"] == row["key"] for r in rows) > 1}:
        found.append(f"`## {title}` documents `{key}` twice")
    names = {name for name, _ in fields}
    for name, kind in fields:
        if kind != "spread" and name not in said:
            found.append(f"{cls.__name__}.{name} prints the key `{name}`, which `## {title}` does not document")
    spread_rows = [row["key"] for row in rows if "spread" in row.get("present", "")]
    for key in said:
        if key not in names and key not in spread_rows:
            found.append(f"`## {title}` documents `{key}`, which {cls.__name__} does not print (no such field)")
    for key in spread_rows:
        if key in names:
            found.append(f"`## {title}`: `{key}` is marked spread, but it is a field of {cls.__name__}")
    if spread_rows and not any(kind == "spread" for _, kind in fields):
        found.append(f"`## {title}` marks keys spread, but {cls.__name__} has no spread() field")
    for name, kind in fields:
        row = said.get(name)
        if row is None or kind == "spread":
            continue
        present = row.get("present", "")
        if kind == "absent" and "absent" not in present:
            found.append(f"`## {title}`: `{name}` is absent_when_none(): its `present` cell must say when it is "
                         f"absent, not {present!r}")
        if kind == "plain" and present != "always":
            found.append(f"`## {title}`: `{name}` is always printed: its `present` cell must be 'always', "
                         f"not {present!r}")
    expected = []                          # the printed order, a spread field's documented keys in its place
    for name, kind in fields:
        expected += [key for key in said if key in spread_rows] if kind == "spread" else [name]
    if not found and [key for key in said] != expected:
        found.append(f"`## {title}` lists its keys in another order than {cls.__name__} prints them: "
                     f"{list(said)} != {expected}")
    return found


# --- the tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("title", list(COMMANDS))
def test_each_command_documents_exactly_the_keys_its_result_prints(page, title):
    cls = COMMANDS[title]
    parent = COMMANDS[INHERITS[title]] if title in INHERITS else None
    assert problems(title, cls, page, parent) == []


def test_distill_documents_its_own_keys_after_those_it_shares_with_train(page):
    student, train = printed(DistillResult), printed(TrainResult)
    assert student[:len(train)] == train, "DistillResult's object begins with TrainResult's keys, in their order"
    assert issubclass(DistillResult, TrainResult)
    assert "every key of\n[train](#train)" in DOC.read_text(encoding="utf-8").replace("**", "")


def test_every_command_of_the_architecture_table_has_a_section(page):
    """Every result class of docs/architecture.md's Results table has a section here, by class name."""
    table = (DOC.parent / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(\w+Result)`", table.split("## Results", 1)[1].split("\n## ", 1)[0]))
    documented = {cls.__name__ for cls in COMMANDS.values()}
    assert named <= documented, f"results with no section in docs/json.md: {sorted(named - documented)}"
    for title, cls in COMMANDS.items():
        lines = [line for line in DOC.read_text(encoding="utf-8").split(f"\n## {title}\n", 1)[1].splitlines()
                 if line.startswith("Result:")]
        assert lines and f"`{cls.__name__}`" in lines[0], f"`## {title}` does not name {cls.__name__} as its result"
        module = Path(inspect.getfile(cls)).relative_to(DOC.parents[1]).as_posix()
        assert f"`{module}`" in lines[0], f"`## {title}` does not name {cls.__name__}'s module {module}"


def _returned_keys(function: Any) -> set[str]:
    """The string keys of the dict literal that ``function`` returns."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    assert keys, f"{function.__qualname__} returns no dict literal: update this test"
    return keys


def test_a_training_runs_spread_figures_are_those_the_loop_gives(page):
    """``TrainResult.metrics`` is a spread field: its keys are the training loop's final figures
    (``Trainer.finish``: always there in process) and its last check's (``Trainer._metrics``),
    less the result's named fields. Each is documented as spread, and the always-present ones as
    always."""
    rows = {row["key"]: row for row in page["train"].rows}
    spread_rows = {key for key, row in rows.items() if "spread" in row["present"]}
    final = _returned_keys(loop.Trainer.finish) - NAMED
    checked = _returned_keys(loop.Trainer._metrics) - NAMED
    assert final <= spread_rows, f"undocumented spread keys of Trainer.finish: {sorted(final - spread_rows)}"
    assert checked <= spread_rows, f"undocumented spread keys of Trainer._metrics: {sorted(checked - spread_rows)}"
    assert spread_rows <= final | checked, f"spread keys the loop does not give: {sorted(spread_rows - final - checked)}"
    for key in final - checked:
        assert "always" in rows[key]["present"], f"`{key}` is always there in process (Trainer.finish)"


def test_the_nested_records_tables_match_their_classes(page):
    documented = {(title, path) for title, section in page.items() for path in section.nested()}
    assert documented == set(NESTED), (f"nested tables documented but not checked: {sorted(documented - set(NESTED))}; "
                                       f"checked but not documented: {sorted(set(NESTED) - documented)}")
    for (title, path), keys in NESTED.items():
        table = page[title].nested()[path]
        assert table.keys == keys(), f"`## {title}` `### {path}`: {table.keys} != {keys()}"
        top = path.split("[")[0].split(".")[0]
        assert top in page[title].keys, f"`## {title}` `### {path}` is of no documented key `{top}`"


@pytest.mark.parametrize("title", list(COMMANDS))
def test_each_example_is_json_whose_keys_are_documented_in_order(page, title):
    section = page[title]
    assert len(section.examples) == 1, f"`## {title}` should hold one ```json example"
    example = json.loads(section.examples[0])
    keys = (page[INHERITS[title]].keys if title in INHERITS else []) + section.keys
    assert set(example) <= set(keys), f"`## {title}`'s example has undocumented keys {sorted(set(example) - set(keys))}"
    assert [k for k in keys if k in example] == list(example), f"`## {title}`'s example is not in the documented order"
    assert list(example)[0] == "warnings"


def test_the_failure_and_stop_objects_are_those_the_command_line_prints(page, capsys):
    from iaa.cli import output

    output.expected_failure("a failure", as_json=True)
    failure = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with pytest.raises(SystemExit):
        output._interrupted(KeyboardInterrupt(), as_json=True)
    stop = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    section = page["Failures and stops"]
    assert section.keys == list(stop) and set(failure) <= set(stop)
    shown = [json.loads(example) for example in section.examples]
    assert [list(o) for o in shown] == [list(failure), list(stop)]
    assert (failure["exit_code"], stop["interrupted"], stop["exit_code"]) == (1, "SIGINT", 130)


def test_an_undocumented_field_or_a_stale_key_is_caught(page):
    """The checks themselves: a result that gains a field, or loses one the page lists, fails."""
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Grown(PrepareResult):
        a_new_figure: int = 0

    grown = problems("prepare", Grown, page)
    assert any("a_new_figure" in p and "does not document" in p for p in grown), grown

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Maybe(PrepareResult):
        a_new_figure: int | None = result_module.absent_when_none()

    assert any("a_new_figure" in p for p in problems("prepare", Maybe, page))
    shrunk = dataclasses.make_dataclass("Shrunk", [("warnings", tuple, dataclasses.field(default=()))])
    stale = problems("prepare", shrunk, page)
    assert any("`vocab_size`" in p and "does not print" in p for p in stale), stale
