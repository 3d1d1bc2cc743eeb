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
import sys
import time

import torch

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))

COMMON = ["--task", "translation", "--source-lang", "ja", "--target-lang", "en", "--cpu", "--dropout", "0.1"]
SIZE = {"embed": 256, "hidden": 256, "layers": 2}


def fairseq_lstm_args(size):
    return [
        "--arch", "lstm", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--encoder-embed-dim", str(size["embed"]), "--encoder-hidden-size", str(size["hidden"]),
        "--encoder-layers", str(size["layers"]), "--encoder-bidirectional",
        "--decoder-embed-dim", str(size["embed"]), "--decoder-hidden-size", str(size["hidden"]),
        "--decoder-layers", str(size["layers"]), "--decoder-out-embed-dim", str(size["embed"]),
    ]


USER_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fairseq_hybrid"))


def hybrid_lstm_base_args(size):
    # The shipped preset: only the bottom encoder layer bidirectional.
    return ["--user-dir", USER_DIR, "--arch", "hybrid_lstm_base", "--criterion", "hybrid_cross_entropy",
            "--label-smoothing", "0.1"]


def hybrid_lstm_args(size):
    # Every encoder layer bidirectional, as in fairseq's lstm, so that the two
    # differ only in input feeding and in how the decoder and loss are run.
    return [
        "--user-dir", USER_DIR,
        "--arch", "hybrid_lstm", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
        "--encoder-embed-dim", str(size["embed"]), "--encoder-hidden-size", str(size["hidden"]),
        "--encoder-layers", str(size["layers"]), "--encoder-bidirectional-layers", str(size["layers"]),
        "--decoder-embed-dim", str(size["embed"]), "--decoder-hidden-size", str(size["hidden"]),
        "--decoder-layers", str(size["layers"]), "--decoder-out-embed-dim", str(size["embed"]),
    ]


def build(data, model_args):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data] + COMMON + model_args)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion


def batches(task, max_tokens, count):
    iterator = task.get_batch_iterator(
        task.dataset("train"), max_tokens=max_tokens, max_positions=(64, 64),
        ignore_invalid_inputs=True, seed=1,
    ).next_epoch_itr(shuffle=True)
    return [next(iterator) for _ in range(count)]


def run_steps(model, criterion, optimizer, samples, device="cpu"):
    """fairseq-style training steps; returns (target tokens, seconds).  On
    ``device="cuda"`` samples move to the GPU and the time includes the
    wait for the queued kernels."""
    model.train()
    tokens = 0
    start = time.perf_counter()
    for sample in samples:
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            from fairseq import utils

            sample = utils.move_to_cuda(sample)
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        optimizer.step()
        tokens += sample["ntokens"]
    if device == "cuda":
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - start


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
        parser.error(f"{args.data}: no such folder (run recipes/tatoeba_ja_en/run.sh --steps download,prepare,spm,binarize)")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)

    systems = {}
    for name, model_args in (("fairseq lstm", fairseq_lstm_args(SIZE)),
                             ("hybrid_lstm, all-bidirectional encoder", hybrid_lstm_args(SIZE)),
                             ("hybrid_lstm_base", hybrid_lstm_base_args(SIZE))):
        task, model, criterion = build(args.data, model_args)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        systems[name] = {"model": model, "criterion": criterion, "optimizer": optimizer,
                         "params": sum(p.numel() for p in model.parameters()), "tokens": 0, "seconds": 0.0}
    samples = batches(task, args.max_tokens, args.batches + 2)
    for system in systems.values():  # warm-up, untimed
        run_steps(system["model"], system["criterion"], system["optimizer"], samples[:2])
    for round_index in range(args.rounds):
        for name, system in systems.items():
            tokens, seconds = run_steps(system["model"], system["criterion"], system["optimizer"], samples[2:])
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
