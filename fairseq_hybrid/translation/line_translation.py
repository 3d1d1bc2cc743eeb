"""Translating lines so that line N out is always the translation of line N in.

fairseq's own tools stop at the first line they cannot take:
fairseq-interactive and the hub raise "Size of sample #N is invalid" for
one line longer than the model's ``max_positions`` and every other line of
the input is lost with it.  :class:`LineTranslator` takes lines cleaned by
:mod:`fairseq_hybrid.translation.line_input` and gives one result per line, in order:

- a blank line is not translated: its translation is the empty string;
- a line longer than the model accepts is cut into sentences (after
  ``。．！？!?.`` and their full-width forms), a sentence still too long
  into pieces of the model's limit, and the pieces' translations are
  joined with spaces; the line's notes say so;
- a batch that fails is retried line by line, so one bad line fails
  alone: its result carries the error and an empty translation, and the
  other lines are translated as usual.

Lines are translated in batches (``buffer_size`` lines handed to fairseq's
``generate`` at once, which batches them by length), the way
fairseq-interactive does, so a long input is not one model call a line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional

import torch

from .line_input import InputLine, one_line

logger = logging.getLogger(__name__)

# A sentencepiece piece ending with one of these ends a sentence.
SENTENCE_ENDS = ("。", "．", "！", "？", "!", "?", ".", "｡")


@dataclass
class LineResult:
    """What became of one input line: its translation ("" when blank or
    failed), what was done to it (notes) and why it failed (error)."""

    number: int
    translation: str = ""
    notes: List[str] = field(default_factory=list)
    error: Optional[str] = None

    def messages(self) -> Iterator[str]:
        """One message per note or error, each naming the line."""
        for note in self.notes:
            yield f"line {self.number}: {note}"
        if self.error is not None:
            yield f"line {self.number}: not translated: {self.error}"


def split_pieces(tokens: List[str], limit: int) -> List[List[str]]:
    """Cut a line's subword tokens into sentences, and a sentence longer
    than ``limit`` tokens into pieces of ``limit``."""
    sentences, current = [], []
    for token in tokens:
        current.append(token)
        if token.endswith(SENTENCE_ENDS):
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    pieces = []
    for sentence in sentences:
        pieces.extend(sentence[start:start + limit] for start in range(0, len(sentence), limit))
    return pieces


class LineTranslator:
    """Translates :class:`InputLine` values with a fairseq
    ``GeneratorHubInterface`` (its ``encode`` steps, ``generate`` and
    ``decode``), one :class:`LineResult` per line, in input order."""

    def __init__(self, hub, beam: int = 5, buffer_size: int = 64, **generation):
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1, got {buffer_size}")
        self.hub = hub
        self.beam = beam
        self.buffer_size = buffer_size
        self.generation = generation
        # tokens a source may have besides its end-of-sentence token
        self.limit = self.source_limit(hub) - 1

    @staticmethod
    def source_limit(hub) -> int:
        """The longest source, end-of-sentence token included, that the
        model and its batching accept."""
        limit = hub.max_positions[0] if isinstance(hub.max_positions, tuple) else hub.max_positions
        max_tokens = hub.cfg.dataset.max_tokens
        return min(int(limit), int(max_tokens)) if max_tokens else int(limit)

    def translate(self, lines: Iterable[InputLine]) -> Iterator[LineResult]:
        """Results in input order, ``buffer_size`` lines at a time, so a
        stream is answered while it is still being read."""
        buffer: List[InputLine] = []
        for line in lines:
            buffer.append(line)
            if len(buffer) == self.buffer_size:
                yield from self._translate_buffer(buffer)
                buffer = []
        if buffer:
            yield from self._translate_buffer(buffer)

    def _pieces(self, line: InputLine, result: LineResult) -> List[torch.Tensor]:
        tokens = self.hub.apply_bpe(self.hub.tokenize(line.text.strip())).split()
        if len(tokens) <= self.limit:
            return [self.hub.binarize(" ".join(tokens))]
        pieces = split_pieces(tokens, self.limit)
        result.notes.append(f"{len(tokens)} subword tokens, longer than the model's limit of {self.limit}: "
                            f"translated in {len(pieces)} pieces (sentence by sentence, a sentence over the "
                            f"limit cut at it), joined with spaces")
        return [self.hub.binarize(" ".join(piece)) for piece in pieces]

    def _generate(self, sources: List[torch.Tensor]) -> List[str]:
        hypotheses = self.hub.generate(sources, beam=self.beam, **self.generation)
        return [one_line(self.hub.decode(best[0]["tokens"])) for best in hypotheses]

    def _translate_buffer(self, lines: List[InputLine]) -> List[LineResult]:
        results = [LineResult(line.number, notes=list(line.notes)) for line in lines]
        pending = []  # (result, its pieces)
        for line, result in zip(lines, results):
            if line.blank:
                continue
            try:
                pending.append((result, self._pieces(line, result)))
            except Exception as error:  # a line's own encoding failed: that line alone
                result.error = _describe(error)
        try:
            self._fill(pending)
        except Exception as error:
            logger.info("a batch of %d lines failed (%s); translating them one by one", len(pending),
                        _describe(error))
            for one in pending:
                try:
                    self._fill([one])
                except Exception as error:
                    one[0].error = _describe(error)
        return results

    def _fill(self, pending) -> None:
        sources = [piece for _, pieces in pending for piece in pieces]
        if not sources:
            return
        translated = self._generate(sources)
        if len(translated) != len(sources):  # fairseq left some out: never pair the rest with the wrong lines
            raise RuntimeError(f"{len(translated)} translations for {len(sources)} sources")
        translations = iter(translated)
        filled = [" ".join(next(translations) for _ in pieces) for _, pieces in pending]
        for (result, _), translation in zip(pending, filled):
            result.translation = translation


def _describe(error: Exception, longest: int = 300) -> str:
    """The error on one line, cut to ``longest`` characters."""
    text = " ".join(str(error).split())
    if len(text) > longest:
        text = text[:longest] + " ..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
