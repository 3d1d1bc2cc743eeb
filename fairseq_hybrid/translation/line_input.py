"""Input lines for translation, one per line whatever the bytes.

A translation tool's worst failure is a silent shift: one odd line and
every later translation sits beside the wrong source.  Tools that read
text with Python's ``str.splitlines`` (as fairseq-interactive's input
does through ``fileinput``), or that treat a file with odd bytes as
binary (``grep``), split or drop lines on bytes that are not a newline:
a NUL, invalid UTF-8, ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, U+0085,
U+2028 and U+2029.  Here a line is what lies between two ``\\n`` bytes
and nothing else; each line is decoded on its own (invalid UTF-8 becomes
U+FFFD, for that line only), a ``\\r`` before the ``\\n`` is dropped (CRLF
files), and every other control or separator character becomes a space,
so no later step can see a line break inside a line.  What was changed is
kept as notes, to be reported with the line's number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Iterator, List, Union

# C0 controls but tab, DEL, C1 controls, and Unicode's line and paragraph
# separators: each is a line break to someone, or invisible noise.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass
class InputLine:
    """One input line: its number (from 1), its text ready for the model,
    and what was changed to make it so."""

    number: int
    text: str
    notes: List[str] = field(default_factory=list)

    @property
    def blank(self) -> bool:
        return not self.text.strip()


def one_line(text: str) -> str:
    """``text`` with every control or separator character a space: what a
    translation written as one output line must be."""
    return _CONTROL.sub(" ", text)


def clean_line(number: int, raw: Union[bytes, str]) -> InputLine:
    """Decode (bytes) and clean one line; ``raw`` holds no ``\\n``."""
    notes = []
    if isinstance(raw, bytes):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            text = raw.decode("utf-8", errors="replace")
            notes.append(f"invalid UTF-8 at byte {error.start + 1} and after replaced by U+FFFD")
    else:
        text = raw[:-1] if raw.endswith("\r") else raw
    text, count = _CONTROL.subn(" ", text)
    if count:
        notes.append(f"{count} control character{'s' if count > 1 else ''} replaced by spaces")
    return InputLine(number, text, notes)


def read_lines(stream: BinaryIO) -> Iterator[InputLine]:
    """Cleaned lines of a binary stream (``sys.stdin.buffer``), read as they
    come, so a long input is translated while it is still being read."""
    for number, raw in enumerate(stream, 1):
        # a binary stream iterates over b"\n"-terminated lines only
        yield clean_line(number, raw[:-1] if raw.endswith(b"\n") else raw)


def clean_lines(lines: Iterable[Union[bytes, str]]) -> List[InputLine]:
    """Cleaned lines from Python values, one value per line (the hub)."""
    return [clean_line(number, _single_line(number, line)) for number, line in enumerate(lines, 1)]


def _single_line(number: int, line: Union[bytes, str]) -> Union[bytes, str]:
    if not isinstance(line, (bytes, str)):
        raise TypeError(f"line {number}: expected str or bytes, got {type(line).__name__}")
    newline, space = (b"\n", b" ") if isinstance(line, bytes) else ("\n", " ")
    # one value is one line: a newline inside it is a space, never a new line
    return line.rstrip(newline).replace(newline, space)
