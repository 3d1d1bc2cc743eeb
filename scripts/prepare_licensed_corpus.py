#!/usr/bin/env python3
"""Clean a licensed ja-en corpus (ASPEC-JE or a patent corpus) into aligned
raw splits, counting every dropped line under its reason.

Writes ``OUT/{train,valid,test}.{ja,en}`` (ASPEC also ``dev``), the
unsegmented references ``OUT/ref/{valid,test}.{ja,en}`` for scoring and
``OUT/prepare_summary.txt``.  Every required input is checked before any
work starts; every output is written under a temporary name and renamed
when complete, the summary last, so a finished summary means a finished
step.

  ASPEC-JE (valid = devtest; train-1 and train-2 by default, as at WAT):
    prepare_licensed_corpus.py --format aspec --aspec-dir ASPEC-JE --out OUT
  Patent corpora, tab-separated ja<TAB>en files:
    prepare_licensed_corpus.py --format tsv --train T.tsv --valid V.tsv --test X.tsv --out OUT
  Patent corpora, aligned one-sentence-a-line files PREFIX.ja and PREFIX.en:
    prepare_licensed_corpus.py --format lines --train T --valid V --test X --out OUT

Japanese and English are normalised with Unicode NFKC (full-width
letters and digits to ASCII, half-width katakana to full width) and
whitespace collapsed.  Training pairs are filtered by length (either side
over --max-tokens; English in words, Japanese in MeCab words), by length
ratio and for exact duplicates; valid and test pairs only for defects.
"""

import argparse
import os
import sys


from fairseq_hybrid.data.corpus_cleaning import (
    DUPLICATE,
    REASONS,
    MisalignedFilesError,
    filter_pairs,
    read_aspec,
    read_line_pairs,
    read_tsv,
    total_counts,
)
from fairseq_hybrid.data.parallel_text import write_atomically


def mecab_words():
    """A function splitting Japanese into MeCab (IPAdic) words, as sacrebleu's
    ``ja-mecab`` tokenizer does."""
    import ipadic
    import MeCab

    tagger = MeCab.Tagger(ipadic.MECAB_ARGS + " -Owakati")
    return lambda text: tagger.parse(text).split()


def input_files(args):
    """``{split: [paths]}`` of the inputs, by format."""
    if args.format == "aspec":
        base = args.aspec_dir
        train = [os.path.join(base, "train", f"{name}.txt") for name in args.train_files.split(",") if name]
        return {
            "train": train,
            "dev": [os.path.join(base, "dev", "dev.txt")],
            "valid": [os.path.join(base, "devtest", "devtest.txt")],
            "test": [os.path.join(base, "test", "test.txt")],
        }
    if args.format == "tsv":
        return {split: [getattr(args, split)] for split in ("train", "valid", "test")}
    return {split: [f"{getattr(args, split)}.ja", f"{getattr(args, split)}.en"] for split in ("train", "valid", "test")}


def check_inputs(files):
    problems = []
    for paths in files.values():
        for path in paths:
            if not os.path.isfile(path):
                problems.append(f"{path}: no such file")
            elif not os.access(path, os.R_OK):
                problems.append(f"{path}: not readable")
    return problems


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_split(args, split, paths):
    """``(pairs, reports)`` of one split, pairs as (line, ja, en)."""
    if args.format == "lines":
        ja_path, en_path = paths
        pairs, report = read_line_pairs(read_bytes(ja_path), read_bytes(en_path), os.path.basename(ja_path)[:-3])
        return pairs, [report]
    pairs, reports = [], []
    for path in paths:
        if args.format == "aspec":
            part, report = read_aspec(read_bytes(path), os.path.basename(path), train=split == "train")
        else:
            part, report = read_tsv(read_bytes(path), os.path.basename(path))
        pairs.extend(part)
        reports.append(report)
    return pairs, reports


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=("aspec", "tsv", "lines"), required=True)
    parser.add_argument("--aspec-dir", help="the ASPEC-JE folder (train/, dev/, devtest/, test/)")
    parser.add_argument("--train-files", default="train-1,train-2", help="ASPEC training files (default: %(default)s)")
    parser.add_argument("--train", help="training file (tsv) or prefix (lines)")
    parser.add_argument("--valid", help="validation file or prefix (model selection)")
    parser.add_argument("--test", help="test file or prefix (final score)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=50, help="longest training sentence in words; 0: no limit")
    parser.add_argument("--max-ratio", type=float, default=9.0, help="longest/shortest side in words; 0: no limit")
    parser.add_argument("--no-dedup", action="store_true", help="keep exact duplicate training pairs")
    parser.add_argument("--mecab", action="store_true", help="segment Japanese into MeCab words before subwords")
    args = parser.parse_args(argv)

    if args.format == "aspec" and not args.aspec_dir:
        parser.error("--format aspec needs --aspec-dir")
    if args.format != "aspec" and not all((args.train, args.valid, args.test)):
        parser.error(f"--format {args.format} needs --train, --valid and --test")
    files = input_files(args)
    problems = check_inputs(files)
    if problems:
        print("error: required input missing, nothing done:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2

    words = mecab_words()
    reports, kept = [], {}
    try:
        for split, paths in files.items():
            pairs, split_reports = read_split(args, split, paths)
            if split == "train":
                pairs = filter_training_pairs(pairs, split_reports, args, words)
            reports.extend(split_reports)
            kept[split] = pairs
    except MisalignedFilesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    for split, pairs in kept.items():
        if not pairs:
            print(f"error: no {split} pair survived cleaning (see the summary above)", file=sys.stderr)
            return 2

    os.makedirs(os.path.join(args.out, "ref"), exist_ok=True)
    for split, pairs in kept.items():
        ja = [p[1] for p in pairs]
        en = [p[2] for p in pairs]
        if split in ("valid", "test"):
            write_atomically(os.path.join(args.out, "ref", f"{split}.ja"), ja)
            write_atomically(os.path.join(args.out, "ref", f"{split}.en"), en)
        if args.mecab:
            ja = [" ".join(words(text)) for text in ja]
        write_atomically(os.path.join(args.out, f"{split}.ja"), ja)
        write_atomically(os.path.join(args.out, f"{split}.en"), en)

    totals = total_counts(reports)
    lines = [line for report in reports for line in report.summary_lines()]
    lines.append("kept: " + ", ".join(f"{split} {len(pairs)}" for split, pairs in kept.items()))
    lines.append("dropped in all: " + (", ".join(f"{totals[r]} {r}" for r in REASONS if totals[r]) or "nothing"))
    for line in lines:
        print(f"| {line}", flush=True)
    write_atomically(os.path.join(args.out, "prepare_summary.txt"), lines)
    return 0


def filter_training_pairs(pairs, split_reports, args, words):
    """Length, ratio and duplicate filters over training pairs read from one
    or several files (ASPEC train-1, train-2, ...): a duplicate of a pair in
    an earlier file is dropped too, each drop reported against the file it
    came from."""
    by_file, start = [], 0
    for report in split_reports:
        by_file.append(pairs[start : start + report.kept])
        start += report.kept
    seen, kept = set(), []
    for report, file_pairs in zip(split_reports, by_file):
        survivors = filter_pairs(
            file_pairs, report, max_tokens=args.max_tokens, max_ratio=args.max_ratio, deduplicate=False,
            count_src=lambda ja: len(words(ja)), count_tgt=lambda en: len(en.split()),
        )
        final = []
        for number, ja, en in survivors:
            if not args.no_dedup and (ja, en) in seen:
                report.drop(DUPLICATE, number)
                continue
            seen.add((ja, en))
            final.append((number, ja, en))
        report.kept = len(final)
        kept.extend(final)
    return kept


if __name__ == "__main__":
    sys.exit(main())
