"""make-cloze on Ray Data gives the same questions as in-process tagging (slow: starts Ray)."""

from __future__ import annotations

import pytest

import tests._cloze_fake as fake
from iaa.data.cloze.sources import SourceSpec
from iaa.jobs.own_data import make_cloze
from tests.test_cloze import books, files_of, write

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("style", ["cbt-ne", "cnn"])
def test_ray_and_local_tagging_give_identical_files(tmp_path, style):
    import ray.cloudpickle

    from iaa.platform import cloze_ray

    ray.cloudpickle.register_pickle_by_value(fake)  # Ray workers need not import tests/
    src = books(tmp_path, n=3, sentences=90)
    text = write(tmp_path / "news" / "a.txt", fake.article(40, seed=5))
    cfg = make_cloze.ClozeConfig(style, (SourceSpec(src), SourceSpec(text)), valid=1, test=1, seed=7, context=10)
    local = make_cloze.run(cfg, tmp_path / "local", workers=0, tagger=fake.make_fake, progress=False)
    on_ray = make_cloze.run(cfg, tmp_path / "ray", workers=2, tag_map=cloze_ray.tag, tagger=fake.make_fake,
                            progress=False)
    assert local.questions == on_ray.questions and sum(local.questions.values()) > 0
    assert files_of(tmp_path / "local") == files_of(tmp_path / "ray")
