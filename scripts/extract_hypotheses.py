#!/usr/bin/env python3
"""Hypotheses from ``fairseq-generate`` output, in the order of the input.

fairseq prints ``H-<id>\\t<score>\\t<text>`` lines in batch order; this
sorts them by id, checks that every sentence has one (a missing id would
silently misalign the scoring), optionally joins MeCab-segmented Japanese
back into plain text, and writes the file atomically.

The recipes run fairseq-generate with ``--truncate-source`` (a source
longer than ``--max-source-positions`` is translated from its first
tokens instead of stopping the whole run) and
``--skip-invalid-size-inputs-valid-test`` (a source longer than a model
with a smaller limit is left out instead).  ``--source`` (the
subword-encoded source file that was binarized) names each truncated
line; a left-out line is an error naming it (numbered from 1, as in the
source file), so no scoring runs on a test set with holes.

  extract_hypotheses.py generate.out hyp.en --expect 1812 [--join-japanese]
      [--source spm/test.ja --max-source-positions 1024]
"""

import argparse
import re
import sys


from fairseq_hybrid.data.parallel_text import write_atomically

_SEGMENT_SPACE = re.compile(r"(?<=[^\x00-\x7f]) | (?=[^\x00-\x7f])")


def join_japanese_words(text: str) -> str:
    """Undo word segmentation: drop a space unless both neighbours are
    ASCII, so spaces between English words and numbers stay."""
    return _SEGMENT_SPACE.sub("", text)


def over_long_lines(source: str, max_source_positions: int):
    """(line number from 1, token count) of each source line that does not
    fit ``max_source_positions`` with its end-of-sentence token."""
    with open(source, encoding="utf-8", newline="\n") as f:
        for number, line in enumerate(f, 1):
            tokens = len(line.split())
            if tokens + 1 > max_source_positions:
                yield number, tokens


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("generate_out")
    parser.add_argument("hypotheses")
    parser.add_argument("--expect", type=int, required=True, help="number of input sentences")
    parser.add_argument("--join-japanese", action="store_true", help="remove MeCab word boundaries")
    parser.add_argument("--source", help="the subword-encoded source file: name the lines that were truncated")
    parser.add_argument("--max-source-positions", type=int, default=1024,
                        help="fairseq-generate's --max-source-positions (default: 1024, fairseq's)")
    args = parser.parse_args(argv)
    if args.source:
        for number, tokens in over_long_lines(args.source, args.max_source_positions):
            print(f"warning: {args.source}: line {number}: {tokens} tokens and end of sentence, over "
                  f"--max-source-positions {args.max_source_positions}: translated from its first "
                  f"{args.max_source_positions - 1} tokens", file=sys.stderr)

    found = {}
    with open(args.generate_out, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                ident, _, text = line.rstrip("\n").split("\t", 2)
                found[int(ident[2:])] = join_japanese_words(text) if args.join_japanese else text
    missing = sorted(set(range(args.expect)) - set(found))
    if missing or len(found) != args.expect:
        lines = ", ".join(str(ident + 1) for ident in missing[:20]) + (" ..." if len(missing) > 20 else "")
        print(f"error: {args.generate_out}: {len(found)} hypotheses for {args.expect} sentences"
              + (f"; no translation for line {lines} of the source (left out by fairseq-generate: "
                 f"longer than the model accepts?)" if missing else ""), file=sys.stderr)
        return 2
    write_atomically(args.hypotheses, (found[i] for i in range(args.expect)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
