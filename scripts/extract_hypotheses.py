#!/usr/bin/env python3
"""Hypotheses from ``fairseq-generate`` output, in the order of the input.

fairseq prints ``H-<id>\\t<score>\\t<text>`` lines in batch order; this
sorts them by id, checks that every sentence has one (a missing id would
silently misalign the scoring), optionally joins MeCab-segmented Japanese
back into plain text, and writes the file atomically.

  extract_hypotheses.py generate.out hyp.en --expect 1812 [--join-japanese]
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))

from fairseq_hybrid.data.parallel_text import write_atomically  # noqa: E402

_SEGMENT_SPACE = re.compile(r"(?<=[^\x00-\x7f]) | (?=[^\x00-\x7f])")


def join_japanese_words(text: str) -> str:
    """Undo word segmentation: drop a space unless both neighbours are
    ASCII, so spaces between English words and numbers stay."""
    return _SEGMENT_SPACE.sub("", text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("generate_out")
    parser.add_argument("hypotheses")
    parser.add_argument("--expect", type=int, required=True, help="number of input sentences")
    parser.add_argument("--join-japanese", action="store_true", help="remove MeCab word boundaries")
    args = parser.parse_args(argv)

    found = {}
    with open(args.generate_out, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                ident, _, text = line.rstrip("\n").split("\t", 2)
                found[int(ident[2:])] = join_japanese_words(text) if args.join_japanese else text
    missing = sorted(set(range(args.expect)) - set(found))
    if missing or len(found) != args.expect:
        print(f"error: {args.generate_out}: {len(found)} hypotheses for {args.expect} sentences"
              + (f"; missing ids {missing[:10]}" if missing else ""), file=sys.stderr)
        return 2
    write_atomically(args.hypotheses, (found[i] for i in range(args.expect)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
