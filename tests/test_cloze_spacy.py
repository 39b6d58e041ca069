"""make-cloze with the real spaCy tagger (skipped when the ``cloze`` extra is not installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from iaa.data.formats import cbt
from iaa.data.cloze.sources import TEXT, TOKENS, SourceSpec
from iaa.data.cloze.tagging import DEFAULT_PIPELINE, SpacyTagger, check_pipeline
from iaa.errors import IaaError
from iaa.jobs.own_data import make_cloze
from tests._shared import require_shared

spacy = pytest.importorskip("spacy", reason='spaCy is an optional extra: pip install -e ".[cloze]"')
if not spacy.util.is_package(DEFAULT_PIPELINE):
    pytest.skip(f"the spaCy pipeline {DEFAULT_PIPELINE} is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def tagger() -> SpacyTagger:
    return SpacyTagger()


def test_tokenised_sentences_keep_their_words_and_get_tags_and_entities(tagger):
    line = "`` Where is Mary ? '' said John Smith to the old man in London ."
    (s,), = tagger.tag([(TOKENS, line)])
    assert " ".join(s.words) == line and len(s.tags) == len(s.words)
    assert s.tags[s.words.index("man")] == "NN" and s.tags[s.words.index("said")] == "VBD"
    named = {" ".join(s.words[a:b]): label for a, b, label in s.ents}
    assert named.get("John Smith") == "PERSON" and named.get("London") == "GPE"


def test_plain_text_is_split_into_sentences_in_ptb_spelling(tagger):
    [sents] = tagger.tag([(TEXT, 'Alice (a girl) met Bob in Paris. "Hello," she said.')])
    assert [" ".join(s.words) for s in sents] == ["Alice -LRB- a girl -RRB- met Bob in Paris .",
                                                  "`` Hello , '' she said ."]


def test_a_pipeline_that_is_not_installed_says_what_to_install():
    with pytest.raises(IaaError, match=r'not installed.*pip install -e "\.\[cloze\]"'):
        check_pipeline("xx_no_such_pipeline")
    with pytest.raises(IaaError, match="not installed"):
        SpacyTagger("xx_no_such_pipeline")


def test_cbt_ne_from_a_real_book_round_trips(tmp_path: Path):
    books = require_shared("cbt-recon/books/cbt_valid.txt")
    head = []
    with open(books, encoding="utf-8") as f:
        for line in f:
            head.append(line)
            if len(head) > 300:
                break
    src = tmp_path / "book.txt"
    src.write_text("".join(head), encoding="utf-8")
    cfg = make_cloze.ClozeConfig("cbt-ne", (SourceSpec(src),))
    result = make_cloze.run(cfg, tmp_path / "out", workers=0, progress=False)
    examples = cbt.read(tmp_path / "out" / "cbtest_NE_train.txt").examples()
    assert len(examples) == result.questions["train"] > 5
    assert all(ex.answer in ex.doc and len(ex.candidates) == 10 for ex in examples)


def test_cli_makes_cnn_questions_from_plain_text(tmp_path: Path):
    import json

    from click.testing import CliRunner

    from iaa.cli import cli
    from iaa.data.formats import cnn

    people = ["Alice Brown", "Tom Green", "Mary Stone", "Peter White"]
    text = "\n\n".join(f"{people[i % 4]} walked to London with {people[(i + 1) % 4]} on day {i}. "
                       f"Later {people[(i + 2) % 4]} wrote a letter to {people[i % 4]} in Paris." for i in range(30))
    (tmp_path / "news").mkdir()
    (tmp_path / "news" / "story.txt").write_text(text + "\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["make-cloze", "--style", "cnn", "--source", str(tmp_path / "news"),
                                   "--out", str(tmp_path / "out"), "--context", "10", "--stride", "3",
                                   "--workers", "0", "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout.strip().splitlines()[-1])
    examples = cnn.read(tmp_path / "out")["train"].examples()
    assert len(examples) == result["questions"]["train"] > 3
    assert all(ex.answer in ex.candidates and "@placeholder" in ex.query for ex in examples)
