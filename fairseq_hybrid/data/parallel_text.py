"""Strict reading of sentence-aligned parallel text files.

A translation corpus is two files whose line ``i`` are translations of each
other.  One bad line (an undecodable byte, a missing line at the end of one
file) silently shifts every later pair out of alignment, so readers here
refuse such input with an error that names the file and line, instead of
letting fairseq-preprocess binarize garbage.  Empty lines are the one defect
that can be repaired without losing alignment: the whole pair is dropped and
counted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Tuple


class ParallelTextError(ValueError):
    """Raised for parallel text that cannot be used without losing alignment."""


@dataclass
class ParallelReadReport:
    """What a read kept and dropped; printed by the command-line tools."""

    kept: int = 0
    dropped_empty: List[int] = field(default_factory=list)

    def summary(self) -> str:
        text = f"kept {self.kept} pairs"
        if self.dropped_empty:
            shown = ", ".join(str(n) for n in self.dropped_empty[:10])
            more = "" if len(self.dropped_empty) <= 10 else ", ..."
            text += f"; dropped {len(self.dropped_empty)} pairs with an empty side (lines {shown}{more})"
        return text


def _decoded_lines(path: str) -> List[str]:
    if not os.path.exists(path):
        raise ParallelTextError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ParallelTextError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        raw_lines = f.read().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ParallelTextError(
                f"{path}:{number}: invalid UTF-8 at byte {err.start} of the line "
                f"({raw[max(0, err.start - 8): err.start + 8]!r}); fix or remove this line "
                f"in both files so that the pairs stay aligned"
            ) from None
        lines.append(text.rstrip("\r"))
    return lines


def read_parallel(
    src_path: str, tgt_path: str, allow_empty: bool = False
) -> Tuple[List[Tuple[str, str]], ParallelReadReport]:
    """Return the aligned ``(source, target)`` pairs of two files.

    Raises :class:`ParallelTextError` for a missing file, invalid UTF-8 or a
    line-count mismatch.  A pair with an empty (or all-whitespace) side is an
    error unless ``allow_empty``, in which case the pair is dropped and its
    line number recorded in the report.
    """
    src_lines = _decoded_lines(src_path)
    tgt_lines = _decoded_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ParallelTextError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}: "
            f"the files are not sentence-aligned"
        )
    report = ParallelReadReport()
    pairs = []
    for number, (src, tgt) in enumerate(zip(src_lines, tgt_lines), start=1):
        src, tgt = src.strip(), tgt.strip()
        if not src or not tgt:
            if not allow_empty:
                side = src_path if not src else tgt_path
                raise ParallelTextError(
                    f"{side}:{number}: empty line; pass --allow-empty to drop such pairs"
                )
            report.dropped_empty.append(number)
            continue
        pairs.append((src, tgt))
    report.kept = len(pairs)
    return pairs, report


def write_atomically(path: str, lines) -> None:
    """Write ``lines`` to ``path`` via a temporary name, so an interrupted
    write never leaves a file that looks finished."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
    os.replace(tmp, path)
