#!/usr/bin/env python3
"""What the Tatoeba recipe prints at the end of a run: the scores with their
sacrebleu signatures, five test sentences with reference and translation,
and the two ways to translate your own text with the run."""

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = "ひとつ質問してもいいですか。"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", help="the run folder (score.json, hyp.en, train.log)")
    parser.add_argument("--arch", default="hybrid_lstm_base")
    parser.add_argument("--raw", required=True, help="the raw split (test.ja, test.en)")
    parser.add_argument("--select", default="average")
    parser.add_argument("--examples", type=int, default=5)
    args = parser.parse_args()
    scores = json.load(open(os.path.join(args.run, "score.json")))
    updates = re.findall(r"num_updates[ =](\d+)", open(os.path.join(args.run, "train.log")).read())
    print(f"\n{args.arch}, checkpoint_{args.select}.pt after {updates[-1] if updates else '?'} updates: "
          + ", ".join(f"{score['name']} {score['score']}" for score in scores))
    for score in scores:
        print(f"  {score['name']} signature: {score['signature']}")
    sources = open(os.path.join(args.raw, "test.ja"), encoding="utf-8").read().split("\n")
    references = open(os.path.join(args.raw, "test.en"), encoding="utf-8").read().split("\n")
    hypotheses = open(os.path.join(args.run, "hyp.en"), encoding="utf-8").read().split("\n")
    print(f"\n{args.examples} test sentences (source, reference, translation):")
    for index in range(min(args.examples, len(hypotheses))):
        print(f"  {sources[index]}\n    reference:   {references[index]}\n    translation: {hypotheses[index]}")
    print(f"\nTranslate your own text:\n"
          f"  from the shell:  echo \"{EXAMPLE}\" | bash {os.path.join(HERE, 'translate.sh')} --run {args.run}\n"
          f"  from Python:     from fairseq_hybrid.translation.hub import load_translator\n"
          f"                   load_translator(\"{args.run}\").translate(\"{EXAMPLE}\")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
