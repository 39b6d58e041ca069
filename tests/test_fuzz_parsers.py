"""Fuzzing the CBT and CNN readers with random edits of real samples.

Each edited file must either parse to exactly the records a plain reference parser finds, or fail
with a DataError that names the file (and a line inside it, for CBT). Any other exception is a
bug. The seed is fixed and the number of cases bounded, so the test is deterministic and fast.
"""

from __future__ import annotations

import io
import random
import tarfile

import pytest

from _shared import require_shared
from iaa.data.formats import cbt, cnn, raw_text
from iaa.data.bad_input import DataError

SEED = 20260101
CASES = 150
SAMPLES = "cbt/official-samples/data"
PIECES = [b"\n", b"\n\n", b"\t", b"|", b" ", b"XXXXX", b"21 ", b"\r\n", b"\xff\xfe", b"\xc3", b"0", b"@entity1",
          b"@placeholder", b":"]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to three random edits: delete, insert, replace, duplicate or drop a line, truncate."""
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        pos = rng.randrange(len(data) + 1)
        if kind == 0:
            data = data[:pos] + data[pos + rng.randint(1, 40):]
        elif kind == 1:
            data = data[:pos] + rng.choice(PIECES) + data[pos:]
        elif kind == 2 and data:
            data = data[:pos] + rng.choice(PIECES) + data[pos + 1:]
        elif kind in (3, 4):
            lines = data.split(b"\n")
            i = rng.randrange(len(lines))
            lines[i:i + 1] = [lines[i], lines[i]] if kind == 3 else []
            data = b"\n".join(lines)
        else:
            data = data[:pos]
    return data


def reference_cbt(text: str) -> list[tuple]:
    """Complete, well-formed examples of a CBT text, by plain Python; None when any example is bad."""
    out = []
    text = text.replace("\r\n", "\n")  # the reader accepts CRLF line ends
    blocks = [b for b in text.split("\n\n") if b.strip("\n")]
    for k, block in enumerate(blocks):
        lines = block.strip("\n").split("\n")
        numbered = all(line.split(" ", 1)[0] == str(i) for i, line in enumerate(lines, 1))
        at_end = k == len(blocks) - 1 and not text.endswith("\n\n")
        if at_end and numbered and len(lines) <= 21 and (len(lines) < 21 or not text.endswith("\n")):
            continue  # the file stops inside its last example: reported as cut off, not used
        if len(lines) != 21 or not numbered or any(len(line.split(" ", 1)) < 2 for line in lines):
            return None
        fields = lines[20].split(" ", 1)[1].split("\t")
        if len(fields) != 4:
            return None
        query, answer, cands = fields[0].split(), fields[1].strip(), [c.strip() for c in fields[3].strip().split("|")]
        doc = [w for line in lines[:20] for w in line.split(" ", 1)[1].split()]
        if (not answer or "" in cands or query.count("XXXXX") != 1 or answer not in cands
                or len(set(cands)) != len(cands) or answer not in doc):
            return None
        out.append((tuple(doc), tuple(query), tuple(cands), answer))
    return out


def cbt_samples() -> list[bytes]:
    folder = require_shared(SAMPLES)
    return [p.read_bytes() for p in sorted(folder.glob("*.txt"))]


def test_cbt_reader_parses_exactly_or_raises_a_data_error(tmp_path):
    samples = cbt_samples()
    rng = random.Random(SEED)
    outcomes = {"parsed": 0, "error": 0}
    for case in range(CASES):
        data = mutate(rng.choice(samples), rng)
        path = tmp_path / f"cbtest_NE_train_{case}.txt"
        path.write_bytes(data)
        try:
            chunk = cbt.read(path)
        except DataError as err:
            outcomes["error"] += 1
            assert str(path) in str(err), (case, str(err))
            assert err.line is None or 1 <= err.line <= data.count(b"\n") + 1, (case, str(err))
            skipped = cbt.read(path, on_error="skip")  # skip mode never raises for bad examples
            assert sum(skipped.skipped.values()) >= 1 or not data.strip(b"\n"), case
            continue
        outcomes["parsed"] += 1
        expected = reference_cbt(data.decode("utf-8", "replace"))  # bad bytes may sit in a cut-off example
        got = [(ex.doc, ex.query, ex.candidates, ex.answer) for ex in chunk.examples()]
        assert got == expected, case
    assert outcomes["parsed"] >= 10 and outcomes["error"] >= 10, outcomes  # both paths are exercised


def cnn_question(entity: int, other: int) -> bytes:
    return (f"http://web.archive.org/x\n\n@entity{other} met @entity{entity} in @entity7 ; later @entity{entity} "
            f"left .\n\n@placeholder left @entity{other}\n\n@entity{entity}\n\n@entity{entity}:Ann\n"
            f"@entity{other}:Bob\n@entity7:Paris\n").encode()


def reference_cnn(data: bytes) -> tuple | None:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data[:4096]:    # UTF-16 (or binary)
        return None
    try:
        lines = data.decode("utf-8").replace("\r\n", "\n").split("\n")
    except UnicodeDecodeError:
        return None
    if len(lines) < 7 or any(not lines[i].strip() for i in (0, 2, 4, 6)) or any(lines[i].strip() for i in (1, 3, 5)):
        return None
    if len(lines) > 7 and lines[7].strip():          # line 8 is blank: a question has one answer
        return None
    if any(line.strip() and not cnn._ENTITY_LINE.match(line) for line in lines[8:]):
        return None
    doc, query, answer = lines[2].split(), lines[4].split(), lines[6].strip()
    cands = tuple(dict.fromkeys(t for t in doc if cnn._ENTITY.match(t)))
    if query.count("@placeholder") != 1 or answer not in cands:
        return None
    return tuple(doc), tuple(query), cands, answer


def test_cnn_reader_parses_exactly_or_raises_a_data_error():
    rng = random.Random(SEED)
    good = [cnn_question(0, 3), cnn_question(5, 2)]
    for case in range(CASES):
        data = mutate(rng.choice(good), rng)
        name = f"questions/training/q{case}.question"
        expected = reference_cnn(data)
        try:
            chunk = cnn.parse_files([(name, data)])
        except DataError as err:
            assert name in str(err), (case, str(err))
            assert expected is None, (case, str(err))
            continue
        (ex,) = chunk.examples()
        assert (ex.doc, ex.query, ex.candidates, ex.answer) == expected, case


def test_a_cnn_file_given_as_raw_input_reads_exactly_or_raises_one_input_error(tmp_path):
    """What `predict`, `evaluate --input` and `explain --input` read: the reference's record, or an
    InputError naming the file; never a question whose answer is not among its candidates."""
    rng = random.Random(SEED + 1)
    good = [cnn_question(0, 3), cnn_question(5, 2)]
    for case in range(CASES):
        data = mutate(rng.choice(good), rng)
        path = tmp_path / f"q{case}.question"
        path.write_bytes(data)
        expected = reference_cnn(data)
        if expected is not None:                     # raw input also reads the names: one name an entity
            named = [line.strip().partition(":") for line in data.decode().replace("\r\n", "\n").split("\n")[8:]]
            if len({(e, n.strip()) for e, _, n in named if e}) != len({e for e, _, _ in named if e}):
                expected = None
        try:
            (q,) = raw_text.read_input(path, "@placeholder")
        except raw_text.InputError as err:
            assert str(path) in str(err) and "\n" not in str(err), (case, str(err))
            assert expected is None, (case, str(err))
            continue
        assert (q.example.doc, q.example.query, q.example.candidates, q.gold) == expected, case
        assert q.gold in q.example.candidates, case


@pytest.mark.parametrize("cut", [0.2, 0.5, 0.9])
def test_cnn_archive_cut_anywhere_is_a_data_error(tmp_path, cut):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for i in range(30):
            data = cnn_question(i % 5, 9) * 30
            info = tarfile.TarInfo(f"questions/training/q{i}.question")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "cnn.tgz"
    path.write_bytes(buffer.getvalue()[: int(len(buffer.getvalue()) * cut)])
    with pytest.raises(DataError, match="cnn.tgz"):
        cnn.read(path)
