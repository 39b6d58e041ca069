"""``--workdir`` on every command, and before the command as a group option that the command
takes unless it has its own (``iaa-cli --workdir W tune ...``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa import cli


def test_every_command_takes_workdir():
    lacking = [name for name, command in cli.cli.commands.items()
               if not any("--workdir" in p.opts for p in command.params)]
    assert not lacking, f"commands without --workdir: {lacking}"


def _prepared_under(args: list[str], env: dict[str, str] | None = None) -> Path:
    result = CliRunner().invoke(cli.cli, args, env=env)
    assert result.exit_code == 0, result.output
    return Path(json.loads(result.stdout.splitlines()[-1])["out"])


@pytest.mark.timeout(300)
def test_the_group_workdir_reaches_the_command_and_the_commands_own_wins(tmp_path: Path) -> None:
    group, own, env = tmp_path / "group", tmp_path / "own", tmp_path / "env"
    demo = ["prepare", "--dataset", "demo", "--json"]
    assert _prepared_under(["--workdir", str(group), *demo]) == group / "data" / "demo"
    assert _prepared_under(["--workdir", str(group), *demo, "--workdir", str(own)]) == own / "data" / "demo"
    # the group's flag, given on the command line, wins over IAA_WORKDIR too
    assert _prepared_under(["--workdir", str(group), *demo], env={"IAA_WORKDIR": str(env)}) == group / "data" / "demo"
    assert _prepared_under(demo, env={"IAA_WORKDIR": str(env)}) == env / "data" / "demo"


@pytest.mark.parametrize("store", ["runs/x", "data", "sweeps/s/q", "."])
def test_make_cloze_refuses_an_out_in_or_over_the_work_folders_stores(tmp_path: Path, store: str) -> None:
    work = tmp_path / "w"
    for folder in ("runs", "data", "sweeps"):
        (work / folder).mkdir(parents=True)
    source = tmp_path / "books.txt"
    source.write_text("Once upon a time there was a cat .\n")
    out = work / store
    result = CliRunner().invoke(cli.cli, ["--workdir", str(work), "make-cloze", "--style", "cbt-ne", "--source",
                                          str(source), "--out", str(out), "--workers", "0"])
    assert result.exit_code == 1 and "the work folder's store" in result.output, result.output
    assert "give another --out" in result.output and result.output.count("\n") == 1
