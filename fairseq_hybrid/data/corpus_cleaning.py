"""Reading licensed corpora (ASPEC-JE, patent corpora) line by line, with
every dropped line counted under its reason.

Real corpora have defects that a strict reader (:mod:`.parallel_text`)
would reject outright: a line with a missing field, an undecodable byte, a
stray control character.  Here each physical line yields at most one pair,
so a bad line is dropped as a whole and can never shift the following pairs
out of alignment; what was dropped, and why, is counted and kept with line
numbers for the summary.  Pair-level filters (length, length ratio, exact
duplicates) run after reading.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

# Reasons, in the order the summary lists them.
WRONG_FIELDS = "wrong number of fields"
INVALID_UTF8 = "invalid UTF-8"
CONTROL_CHARS = "control characters"
EMPTY_SIDE = "empty side"
TOO_LONG = "over-long sentence"
RATIO = "length-ratio outlier"
DUPLICATE = "exact duplicate"
REASONS = (WRONG_FIELDS, INVALID_UTF8, CONTROL_CHARS, EMPTY_SIDE, TOO_LONG, RATIO, DUPLICATE)

# C0/C1 controls other than tab (a field separator in TSV corpora); CR is
# handled separately as a line ending.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass
class CleaningReport:
    """Counts of what a reader kept, repaired and dropped, with line numbers."""

    source: str
    read: int = 0
    kept: int = 0
    crlf_normalised: int = 0
    dropped: Dict[str, List[int]] = field(default_factory=lambda: defaultdict(list))

    def drop(self, reason: str, line_number: int) -> None:
        self.dropped[reason].append(line_number)

    def summary_lines(self) -> List[str]:
        lines = [f"{self.source}: read {self.read} lines, kept {self.kept} pairs"]
        if self.crlf_normalised:
            lines.append(f"  normalised CRLF line endings on {self.crlf_normalised} lines (kept)")
        for reason in REASONS:
            numbers = self.dropped.get(reason, [])
            if numbers:
                shown = ", ".join(str(n) for n in numbers[:10]) + (", ..." if len(numbers) > 10 else "")
                lines.append(f"  dropped {len(numbers)} for {reason} (lines {shown})")
        return lines


def physical_lines(data: bytes) -> Iterator[Tuple[int, bytes]]:
    """``(line number, raw bytes)`` of each line, the final newline optional."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return enumerate(lines, start=1)


def decode_line(raw: bytes, number: int, report: CleaningReport) -> Optional[str]:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
        report.crlf_normalised += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        report.drop(INVALID_UTF8, number)
        return None


def normalise(text: str) -> str:
    """Unicode NFKC (full-width ASCII and half-width katakana to their usual
    forms, as commonly done for ASPEC) and collapsed whitespace."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


class MisalignedFilesError(ValueError):
    """Two one-sentence-a-line files with different line counts: which
    lines belong together cannot be known, so nothing is read."""


def read_line_pairs(
    src_data: bytes, tgt_data: bytes, source: str
) -> Tuple[List[Tuple[int, str, str]], CleaningReport]:
    """Two aligned one-sentence-a-line files (line ``n`` of one translates
    line ``n`` of the other), checked line pair by line pair."""
    src_lines, tgt_lines = list(physical_lines(src_data)), list(physical_lines(tgt_data))
    if len(src_lines) != len(tgt_lines):
        raise MisalignedFilesError(
            f"{source}: {len(src_lines)} source lines but {len(tgt_lines)} target lines; "
            f"the files are not aligned line by line"
        )
    report = CleaningReport(source)
    pairs = []
    for (number, src_raw), (_, tgt_raw) in zip(src_lines, tgt_lines):
        report.read += 1
        crlf = src_raw.endswith(b"\r") or tgt_raw.endswith(b"\r")
        sides = []
        for raw in (src_raw, tgt_raw):
            try:
                sides.append(raw[:-1].decode("utf-8") if raw.endswith(b"\r") else raw.decode("utf-8"))
            except UnicodeDecodeError:
                sides = None
                break
        if sides is None:
            report.drop(INVALID_UTF8, number)
            continue
        report.crlf_normalised += crlf
        pair = _clean_pair(sides[0], sides[1], number, report)
        if pair is not None:
            pairs.append(pair)
    report.kept = len(pairs)
    return pairs, report


def _clean_pair(src: str, tgt: str, number: int, report: CleaningReport) -> Optional[Tuple[int, str, str]]:
    """Control-character and empty-side checks, then normalisation."""
    if _CONTROL.search(src) or _CONTROL.search(tgt):
        report.drop(CONTROL_CHARS, number)
        return None
    src, tgt = normalise(src), normalise(tgt)
    if not src or not tgt:
        report.drop(EMPTY_SIDE, number)
        return None
    return number, src, tgt


def read_fields(
    data: bytes,
    source: str,
    separator: str,
    num_fields: int,
    pick: Callable[[List[str]], Tuple[str, str]],
) -> Tuple[List[Tuple[int, str, str]], CleaningReport]:
    """Split each line on ``separator`` into exactly ``num_fields`` fields and
    ``pick`` the (source, target) pair.  Returns ``(line number, src, tgt)``."""
    report = CleaningReport(source)
    pairs = []
    for number, raw in physical_lines(data):
        report.read += 1
        text = decode_line(raw, number, report)
        if text is None:
            continue
        fields = text.split(separator)
        if len(fields) != num_fields:
            report.drop(WRONG_FIELDS, number)
            continue
        pair = _clean_pair(*pick(fields), number, report)
        if pair is not None:
            pairs.append(pair)
    report.kept = len(pairs)
    return pairs, report


def read_aspec(data: bytes, source: str, train: bool) -> Tuple[List[Tuple[int, str, str]], CleaningReport]:
    """ASPEC-JE: ``score ||| doc-id ||| sent-id ||| ja ||| en`` (train) or
    ``doc-id ||| sent-id ||| ja ||| en`` (dev, devtest, test).  Returns
    ``(line, ja, en)``."""
    if train:
        return read_fields(data, source, " ||| ", 5, lambda f: (f[3], f[4]))
    return read_fields(data, source, " ||| ", 4, lambda f: (f[2], f[3]))


def read_tsv(data: bytes, source: str) -> Tuple[List[Tuple[int, str, str]], CleaningReport]:
    """Tab-separated ``source<TAB>target`` pairs."""
    return read_fields(data, source, "\t", 2, lambda f: (f[0], f[1]))


def filter_pairs(
    pairs: Iterable[Tuple[int, str, str]],
    report: CleaningReport,
    max_tokens: int = 0,
    max_ratio: float = 0.0,
    deduplicate: bool = False,
    count_src: Callable[[str], int] = lambda s: len(s.split()),
    count_tgt: Callable[[str], int] = lambda s: len(s.split()),
) -> List[Tuple[int, str, str]]:
    """Drop over-long pairs (either side over ``max_tokens`` units of its
    ``count_*``: whitespace tokens by default, MeCab tokens or characters for
    unsegmented Japanese), length-ratio outliers (longer side over
    ``max_ratio`` times the shorter) and exact duplicates of an earlier pair;
    0 / False switch a filter off."""
    kept, seen = [], set()
    for number, src, tgt in pairs:
        src_len, tgt_len = count_src(src), count_tgt(tgt)
        if max_tokens and (src_len > max_tokens or tgt_len > max_tokens):
            report.drop(TOO_LONG, number)
            continue
        if max_ratio and max(src_len, tgt_len) > max_ratio * max(1, min(src_len, tgt_len)):
            report.drop(RATIO, number)
            continue
        if deduplicate:
            if (src, tgt) in seen:
                report.drop(DUPLICATE, number)
                continue
            seen.add((src, tgt))
        kept.append((number, src, tgt))
    report.kept = len(kept)
    return kept


def total_counts(reports: Iterable[CleaningReport]) -> Counter:
    totals = Counter()
    for report in reports:
        for reason, numbers in report.dropped.items():
            totals[reason] += len(numbers)
    return totals
