#!/usr/bin/env python3
"""Speed-up of a hybrid group of CPU devices against one CPU device, and
against the machine's ceiling, measured side by side in one run.

Systems, all ``hybrid_lstm_base`` (or ``--arch``) trained with Adam on the
very same Tatoeba batches, every device with one intra-op thread:

* ``1 device``: the single-device model, one thread;
* ``hybrid on K CPU devices`` (and, with ``--modes``, pure model- and pure
  data-parallel on K; with ``--placement``, hybrid with that layer
  placement too): the model with ``--hybrid-devices cpu,...``, one worker
  thread per device; the optimizer step runs on the calling thread between
  steps, while the workers are idle, with K intra-op threads (on GPUs each
  device updates its own parameters, so the update is K-way parallel too);
* ``K independent copies``: the ceiling, K copies of the single-device
  training step (own model, own optimizer, same batches), each on a thread
  of its own, run at once; their summed target tokens/s is what K cores can
  give this step.

Rounds alternate between the systems so that machine noise hits all alike.
Prints target tokens/s, the speed-ups over one device, and the hybrid
speed-up as a fraction of the ceiling's; ``--json`` writes them.

  python scripts/bench_hybrid_cpu.py work/tatoeba_ja_en/bin
"""

import argparse
import json
import logging
import os
import threading
import time

import torch

from benchmarking import NO_DATA, batches, build, preset_args, train_steps


def timed(run, threads):
    """(target tokens, seconds) of ``run`` with ``threads`` intra-op threads."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    tokens = run()
    return tokens, time.perf_counter() - start


def independent_copies(copies, samples):
    """Every copy trains on its own thread (one intra-op thread each), all
    at once; returns total tokens."""
    totals = [0] * len(copies)

    def work(index):
        torch.set_num_threads(1)
        totals[index] = train_steps(*copies[index], samples)[0]

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(copies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(totals)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--arch", default="hybrid_lstm_base")
    parser.add_argument("--devices", type=int, default=2, help="K: CPU devices of the group and independent copies")
    parser.add_argument("--modes", default="hybrid", help="comma-separated hybrid modes to measure (hybrid,model,data)")
    parser.add_argument("--chunk-length", type=int, default=0, help="--hybrid-chunk-length")
    parser.add_argument("--placement", default="", help="also measure hybrid with this --hybrid-placement")
    parser.add_argument("--max-tokens", type=int, default=2000, help="batch size (the Tatoeba recipe's default)")
    parser.add_argument("--batches", type=int, default=10, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the result here")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {NO_DATA}")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    k = args.devices
    modes = [mode for mode in args.modes.split(",") if mode]

    def system(devices="", mode="hybrid", placement=""):
        task, model, criterion = build(args.data, preset_args(args.arch, devices, mode, args.chunk_length, placement))
        return task, (model, criterion, torch.optim.Adam(model.parameters(), lr=1e-3))

    cpus = ",".join(["cpu"] * k)
    task, single = system()
    groups = {}
    for mode in modes:
        label = {"hybrid": "hybrid", "model": "pure model parallel", "data": "pure data parallel"}[mode]
        groups[f"{label} on {k} CPU devices"] = system(cpus, mode)[1]
    if args.placement:
        groups[f"hybrid on {k} CPU devices, placement {args.placement}"] = system(cpus, "hybrid", args.placement)[1]
    copies = [system()[1] for _ in range(k)]
    samples = batches(task, args.max_tokens, args.batches + 2)
    warm, timed_samples = samples[:2], samples[2:]

    # name -> (run, intra-op threads of the calling thread)
    runs = {"1 device": (lambda: train_steps(*single, timed_samples)[0], 1)}
    for name, group in groups.items():
        runs[name] = (lambda group=group: train_steps(*group, timed_samples)[0], k)
    runs[f"{k} independent copies (ceiling)"] = (lambda: independent_copies(copies, timed_samples), 1)

    train_steps(*single, warm)
    for group in groups.values():
        train_steps(*group, warm)
    independent_copies(copies, warm)

    totals = {name: [0, 0.0] for name in runs}
    for round_index in range(args.rounds):
        for name, (run, threads) in runs.items():
            tokens, seconds = timed(run, threads)
            totals[name][0] += tokens
            totals[name][1] += seconds
            print(f"round {round_index + 1}: {name:60s} {tokens / seconds:8.0f} target tokens/s", flush=True)

    base = totals["1 device"][0] / totals["1 device"][1]
    ceiling_name = f"{k} independent copies (ceiling)"
    ceiling = totals[ceiling_name][0] / totals[ceiling_name][1] / base
    result = {"arch": args.arch, "devices": k, "max_tokens": args.max_tokens, "chunk_length": args.chunk_length,
              "placement": args.placement,
              "batches_per_round": args.batches, "rounds": args.rounds, "systems": {}}
    print()
    print("| system | target tokens/s | speed-up over 1 device | fraction of the ceiling |")
    print("| --- | ---: | ---: | ---: |")
    for name, (tokens, seconds) in totals.items():
        rate = tokens / seconds
        speedup = rate / base
        fraction = speedup / ceiling
        result["systems"][name] = {"target_tokens_per_s": rate, "speedup": speedup, "fraction_of_ceiling": fraction}
        print(f"| {name} | {rate:,.0f} | {speedup:.2f}x | {fraction:.0%} |")
    print(f"\n{args.arch}, --max-tokens {args.max_tokens}, {args.rounds} rounds x {args.batches} batches, "
          f"one intra-op thread per device, same batches for every system; fraction of the ceiling = "
          f"speed-up / speed-up of {k} independent copies")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
