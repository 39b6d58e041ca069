"""Hand-written CBT-format text for tests: one valid example and ways to break it."""

from __future__ import annotations

CANDS = ("Anna", "Ben", "Clara", "Dan", "Emma", "Finn", "Gus", "Hana", "Ivo", "Jon")


def sentences(names: tuple[str, ...] = CANDS) -> list[str]:
    """20 context sentences naming every candidate; sentence i mentions names[i % len]."""
    return [f"{names[i % len(names)]} walked to the river number {i} ." for i in range(20)]


def example(*, query: str = "then XXXXX sat down .", answer: str = "Anna", cands: tuple[str, ...] = CANDS,
            context: list[str] | None = None, line21: str | None = None) -> str:
    """One example in the official 21-line format, with the blank line after it."""
    lines = [f"{i} {s}" for i, s in enumerate(context or sentences(), 1)]
    lines.append(line21 if line21 is not None else f"21 {query}\t{answer}\t\t{'|'.join(cands)}")
    return "\n".join(lines) + "\n\n"


def doc_tokens(context: list[str] | None = None) -> tuple[str, ...]:
    return tuple(w for s in (context or sentences()) for w in s.split())


def write_source(folder, *, train: int = 40, valid: int = 10):
    """A small CBTest folder (``folder/CBTest``) of valid NE examples whose answers vary; returns it."""
    from pathlib import Path

    data = Path(folder) / "CBTest" / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, n in (("cbtest_NE_train.txt", train), ("cbtest_NE_valid_2000ex.txt", valid)):
        (data / name).write_text("".join(example(answer=CANDS[i % len(CANDS)]) for i in range(n)), encoding="utf-8")
    return data.parent
