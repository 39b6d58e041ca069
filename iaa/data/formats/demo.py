"""A generated cloze dataset in CBT format: the embedded default, small enough to train on a laptop.

Story grammar (one example; ``|`` separates alternatives, ``[x]`` is optional)::

    story      := 20 sentences, shuffled: 5 binding sentences + 15 filler sentences
    cast       := 10 distinct NAMEs; they are the candidates, sorted as in CBT
    binding    := one per active character (5 of the cast), each binds that character to a
                  PLACE or an OBJECT no one else in the story is bound to:
                  [TIME ,] NAME MOVE to the PLACE [TIME] .
                | [TIME ,] NAME FIND a ADJ OBJECT [in the PLACE2] .
    filler     := [TIME ,] NAME ACT [ADVERB] .
                | [TIME ,] NAME TALK NAME [about the WEATHER weather | for a while] .
                | the weather was WEATHER and the sky was SKY .
                | somewhere the ANIMAL SOUND in the distance .  | it was a WEATHER day for everyone .
                  (every cast member is named at least once; PLACE2 is never a bound place)
    query      := about one active character, chosen uniformly, with XXXXX in its place; half the
                  time it restates the binding (any verb of its kind), else it paraphrases it:
                  place:  XXXXX MOVE to the PLACE .  | [TIME ,] XXXXX was seen near the PLACE .
                        | XXXXX came back from the PLACE .
                  object: XXXXX FIND a ADJ OBJECT .  (the binding's ADJ)
                        | XXXXX showed everyone the OBJECT .  | the OBJECT belonged to XXXXX .
    answer     := the character bound to that PLACE or OBJECT

The answer depends on the query's context: only the place or object it mentions tells which of
the cast it is, and who is named most often is independent of who is asked about, so the
most-frequent-candidate baseline stays far below a reader that matches the query to the story.
Deterministic: split ``s`` of seed ``k`` is drawn from ``random.Random(f"{k}-{s}")``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

from iaa.data.parsed import ClozeExample

VERSION = 2
SEED = 1234
SIZES = {"train": 20_000, "valid": 2_000, "test": 2_000}
CAST, ACTIVE, SENTENCES = 10, 5, 20

NAMES = ("Anna Ben Clara Daniel Emma Felix Greta Hugo Iris Jack Kate Leo Mia Nora Oscar Paul Quinn Rosa "
         "Sam Tara Umar Vera Will Xena Yara Zack Alice Bruno Cora Dylan Elsa Finn Gina Hank Ivy Joel Lina "
         "Max Nina Owen Pia Ray Sara Tom Una Vic Wendy Yuri").split()
PLACES = ("kitchen garden forest river market barn castle bakery library harbor meadow cellar attic bridge "
          "chapel mill orchard pond school stable tower village well beach cave field hill lake park road "
          "shop station temple valley yard inn").split()
OBJECTS = ("apple lamp kite drum ring basket bell book candle coin cup feather flute hat key ladder map "
           "mirror necklace paintbrush pebble pillow rope saddle scarf shell spoon stone sword teapot "
           "trumpet umbrella violin wagon whistle compass").split()
ADJS = "shiny small heavy strange red blue green wooden golden broken tiny".split()
WEATHERS = "cold warm windy sunny rainy calm foggy hot".split()
SKIES = "grey blue clear cloudy dark bright".split()
ADVERBS = ("quietly", "happily", "for a long time", "again", "loudly", "all afternoon")
TIMES = ("in the morning", "after lunch", "at noon", "before dinner", "later that day", "at dawn", "one evening")
MOVES = "went walked ran hurried wandered".split()
FINDS = ("found", "discovered", "picked up", "noticed")
ACTS = "smiled laughed yawned sang sighed nodded waited".split()
TALKS = "talked with|waved at|played with|argued with|helped".split("|")
ANIMALS = "dog owl cow cat goose horse".split()
SOUNDS = "barked hooted mooed called honked neighed".split()


def generate(n: int, rng: random.Random) -> Iterator[ClozeExample]:
    """``n`` stories following the module's grammar."""
    for i in range(n):
        yield _story(rng, f"demo:{i}")


def _story(rng: random.Random, example_id: str) -> ClozeExample:
    cast = rng.sample(NAMES, CAST)
    active = cast[:ACTIVE]
    places, objects = rng.sample(PLACES, ACTIVE + 3), rng.sample(OBJECTS, ACTIVE)
    bound: list[tuple[str, list[str], list[list[str]]]] = []   # (name, restatement, paraphrases)
    sentences = []
    for k, name in enumerate(active):
        lead = [*rng.choice(TIMES).split(), ","] if rng.random() < 0.4 else []
        if rng.random() < 0.5:
            place = places[k]
            tail = rng.choice(TIMES).split() if rng.random() < 0.4 and not lead else []
            sentences.append([*lead, name, rng.choice(MOVES), "to", "the", place, *tail, "."])
            bound.append((name, ["XXXXX", rng.choice(MOVES), "to", "the", place, "."], [
                [*rng.choice(TIMES).split(), ",", "XXXXX", "was", "seen", "near", "the", place, "."],
                ["XXXXX", "came", "back", "from", "the", place, "."]]))
        else:
            thing, adj = objects[k], rng.choice(ADJS)
            where = ["in", "the", rng.choice(places[ACTIVE:])] if rng.random() < 0.4 else []
            sentences.append([*lead, name, *rng.choice(FINDS).split(), "a", adj, thing, *where, "."])
            bound.append((name, ["XXXXX", *rng.choice(FINDS).split(), "a", adj, thing, "."], [
                ["XXXXX", "showed", "everyone", "the", thing, "."],
                ["the", thing, "belonged", "to", "XXXXX", "."]]))
    unnamed = cast[ACTIVE:]
    while len(sentences) < SENTENCES:
        sentences.append(_filler(rng, cast, unnamed))
    rng.shuffle(sentences)
    name, restated, paraphrases = rng.choice(bound)
    query = restated if rng.random() < 0.5 else rng.choice(paraphrases)
    doc = tuple(w for s in sentences for w in s)
    return ClozeExample(example_id, doc, tuple(query), tuple(sorted(cast)), name)


def _filler(rng: random.Random, cast: list[str], unnamed: list[str]) -> list[str]:
    """A sentence without bindings; names the cast members not named yet first."""
    who = unnamed.pop() if unnamed else rng.choice(cast)
    lead = [*rng.choice(TIMES).split(), ","] if rng.random() < 0.3 else []
    r = rng.random()
    if unnamed or r < 0.4:
        tail = rng.choice(ADVERBS).split() if rng.random() < 0.5 else []
        return [*lead, who, rng.choice(ACTS), *tail, "."]
    if r < 0.75:
        other = rng.choice([c for c in cast if c != who])
        tail = rng.choice([["about", "the", rng.choice(WEATHERS), "weather"], ["for", "a", "while"], []])
        return [*lead, who, *rng.choice(TALKS).split(), other, *tail, "."]
    if r < 0.85:
        return ["the", "weather", "was", rng.choice(WEATHERS), "and", "the", "sky", "was", rng.choice(SKIES), "."]
    if r < 0.95:
        k = rng.randrange(len(ANIMALS))
        return ["somewhere", "the", ANIMALS[k], SOUNDS[k], "in", "the", "distance", "."]
    return ["it", "was", "a", rng.choice(WEATHERS), "day", "for", "everyone", "."]


def format_cbt(ex: ClozeExample, sentences: list[list[str]] | None = None) -> str:
    """One example in CBT's 21-line format (with its trailing blank line)."""
    sents = sentences if sentences is not None else _split_sentences(ex.doc)
    lines = [f"{i} {' '.join(s)}" for i, s in enumerate(sents, 1)]
    lines.append(f"{SENTENCES + 1} {' '.join(ex.query)}\t{ex.answer}\t\t{'|'.join(ex.candidates)}")
    return "\n".join(lines) + "\n\n"


def _split_sentences(doc: tuple[str, ...]) -> list[list[str]]:
    out, cur = [], []
    for w in doc:
        cur.append(w)
        if w == ".":
            out.append(cur)
            cur = []
    if cur or len(out) != SENTENCES:
        raise ValueError(f"a demo document must be {SENTENCES} sentences ending in '.'")
    return out


def write_files(folder: Path, *, seed: int | None = None, sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """Write ``demo_{split}.txt`` in CBT format for each split (default: SEED, SIZES); returns split -> path."""
    seed, sizes = (SEED if seed is None else seed), (SIZES if sizes is None else sizes)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in sizes.items():
        rng = random.Random(f"{seed}-{split}")
        path = folder / f"demo_{split}.txt"
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(format_cbt(ex) for ex in generate(n, rng))
        paths[split] = path
    return paths


def fingerprint(seed: int | None = None, sizes: dict[str, int] | None = None) -> dict:
    """What identifies the generated source: generator version, seed and sizes (default: SEED, SIZES)."""
    seed, sizes = (SEED if seed is None else seed), (SIZES if sizes is None else sizes)
    return {"generator": f"iaa.data.formats.demo v{VERSION}", "seed": seed, "sizes": dict(sizes)}
