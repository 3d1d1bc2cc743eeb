#!/usr/bin/env python3
"""Train (if asked) and apply a sentencepiece model to aligned parallel files.

Every input pair is checked first (same line counts, valid UTF-8, no empty
side unless --allow-empty), so that fairseq-preprocess never sees a corpus
that is out of alignment.  Outputs are written under a temporary name and
renamed when complete.

  spm_encode_parallel.py --raw-dir RAW --out-dir OUT --src ja --tgt en \\
      --splits train,valid,test --train-model --vocab-size 8000
"""

import argparse
import os
import sys


from fairseq_hybrid.data.parallel_text import (
    ParallelTextError,
    read_parallel,
    write_atomically,
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-dir", required=True, help="folder with SPLIT.SRC and SPLIT.TGT files")
    parser.add_argument("--out-dir", required=True, help="folder for the encoded files and the model")
    parser.add_argument("--src", required=True, help="source language suffix, e.g. ja")
    parser.add_argument("--tgt", required=True, help="target language suffix, e.g. en")
    parser.add_argument("--splits", default="train,valid,test", help="comma-separated split names")
    parser.add_argument("--train-model", action="store_true", help="train a joint model on the first split")
    parser.add_argument("--separate-models", action="store_true",
                        help="one model per language (PREFIX.SRC.model, PREFIX.TGT.model) instead of a joint one")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--character-coverage", type=float, default=0.9995)
    parser.add_argument("--model-prefix", default=None, help="default: OUT/spm")
    parser.add_argument("--allow-empty", action="store_true", help="drop pairs with an empty side instead of failing")
    parser.add_argument("--max-sentences-for-model", type=int, default=1_000_000)
    args = parser.parse_args(argv)

    import sentencepiece as spm

    if not os.path.isdir(args.raw_dir):
        parser.error(f"--raw-dir {args.raw_dir}: no such folder")
    splits = [s for s in args.splits.split(",") if s]
    corpora = {}
    try:
        for split in splits:
            pairs, report = read_parallel(
                os.path.join(args.raw_dir, f"{split}.{args.src}"),
                os.path.join(args.raw_dir, f"{split}.{args.tgt}"),
                allow_empty=args.allow_empty,
            )
            print(f"| {split}: {report.summary()}", flush=True)
            corpora[split] = pairs
    except ParallelTextError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    os.makedirs(args.out_dir, exist_ok=True)
    prefix = args.model_prefix or os.path.join(args.out_dir, "spm")
    # (model prefix, sides it encodes): one joint model, or one per language.
    if args.separate_models:
        models = [(f"{prefix}.{args.src}", (0,)), (f"{prefix}.{args.tgt}", (1,))]
    else:
        models = [(prefix, (0, 1))]
    for model_prefix, sides in models:
        if args.train_model:
            print(f"| training sentencepiece {os.path.basename(model_prefix)} ({args.vocab_size} pieces) "
                  f"on {splits[0]}", flush=True)
            tmp_prefix = f"{model_prefix}.tmp{os.getpid()}"
            spm.SentencePieceTrainer.train(
                sentence_iterator=(pair[side] for pair in corpora[splits[0]] for side in sides),
                model_prefix=tmp_prefix,
                vocab_size=args.vocab_size,
                character_coverage=args.character_coverage,
                input_sentence_size=args.max_sentences_for_model,
                shuffle_input_sentence=True,
                hard_vocab_limit=False,
                minloglevel=2,
            )
            for ext in ("model", "vocab"):
                os.replace(f"{tmp_prefix}.{ext}", f"{model_prefix}.{ext}")
        if not os.path.isfile(f"{model_prefix}.model"):
            parser.error(f"{model_prefix}.model: no sentencepiece model (pass --train-model)")
        processor = spm.SentencePieceProcessor(model_file=f"{model_prefix}.model")
        for split, pairs in corpora.items():
            for index in sides:
                lang = (args.src, args.tgt)[index]
                pieces = processor.encode([pair[index] for pair in pairs], out_type=str)
                write_atomically(os.path.join(args.out_dir, f"{split}.{lang}"), (" ".join(p) for p in pieces))
    print(f"| wrote {', '.join(splits)} to {args.out_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
