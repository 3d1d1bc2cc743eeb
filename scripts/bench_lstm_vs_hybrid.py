#!/usr/bin/env python3
"""Training throughput of fairseq's ``lstm`` against ``hybrid_lstm`` on one device.

All models are built through fairseq's own option parsing, task and
criterion from the same binarized data, at the same dimensions (embeddings,
hidden size, layers, bidirectional encoder layers, vocabulary), and trained
on the very same batches with the same optimizer.  Rounds alternate between
the models so that machine noise hits both alike.  Prints target tokens
per second of each and the ratios to fairseq's lstm, and writes them as JSON.

  python scripts/bench_lstm_vs_hybrid.py work/tatoeba_ja_en/bin --threads 2
"""

import argparse
import json
import logging
import os

import torch

from benchmarking import NO_DATA, SIZE, batches, build, fairseq_lstm_args, hybrid_lstm_args, preset_args, train_steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--batches", type=int, default=15, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the result here")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {NO_DATA}")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)

    systems = {}
    for name, model_args in (("fairseq lstm", fairseq_lstm_args()),
                             ("hybrid_lstm, all-bidirectional encoder", hybrid_lstm_args()),
                             ("hybrid_lstm_base", preset_args("hybrid_lstm_base"))):
        task, model, criterion = build(args.data, model_args)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        systems[name] = {"model": model, "criterion": criterion, "optimizer": optimizer,
                         "params": sum(p.numel() for p in model.parameters()), "tokens": 0, "seconds": 0.0}
    samples = batches(task, args.max_tokens, args.batches + 2)
    for system in systems.values():  # warm-up, untimed
        train_steps(system["model"], system["criterion"], system["optimizer"], samples[:2])
    for round_index in range(args.rounds):
        for name, system in systems.items():
            tokens, seconds = train_steps(system["model"], system["criterion"], system["optimizer"], samples[2:])
            system["tokens"] += tokens
            system["seconds"] += seconds
            print(f"round {round_index + 1}: {name:40s} {tokens / seconds:8.0f} target tokens/s", flush=True)

    result = {"threads": args.threads, "max_tokens": args.max_tokens, "size": SIZE, "systems": {}}
    for name, system in systems.items():
        result["systems"][name] = {
            "target_tokens_per_s": system["tokens"] / system["seconds"],
            "parameters": system["params"],
        }
    baseline = result["systems"]["fairseq lstm"]["target_tokens_per_s"]
    for row in result["systems"].values():
        row["ratio_to_fairseq_lstm"] = row["target_tokens_per_s"] / baseline
    print()
    print("| model | parameters | target tokens/s | vs fairseq lstm |")
    print("| --- | ---: | ---: | ---: |")
    for name, row in result["systems"].items():
        print(f"| {name} | {row['parameters']:,} | {row['target_tokens_per_s']:,.0f} | {row['ratio_to_fairseq_lstm']:.2f}x |")
    print(f"\n{args.threads} threads, --max-tokens {args.max_tokens}, {args.rounds} rounds x {args.batches} batches each, "
          f"same batches for every model")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
