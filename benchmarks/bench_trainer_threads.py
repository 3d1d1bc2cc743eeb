#!/usr/bin/env python3
"""A group of K CPU devices as fairseq-train runs it (the trainer at the
machine's intra-op threads, torch's default), with the trainer's threads
as the group leaves them (``hybrid_group.leave_cores_to_devices``: the
cores left by the devices, at least one) against the trainer kept at all
of them, for worker threads and for processes: alternating rounds of the
same batches in one process, the faster of each arm's rounds and the
ratio (docs/processes.md, "The trainer's threads").

  python benchmarks/bench_trainer_threads.py work/tatoeba_ja_en/bin --host-bound --out docs/bench/trainer_threads
"""

import argparse
import contextlib
import datetime
import os
import sys
from unittest import mock

import torch

from fairseq_hybrid.harness.measuring import write_report
from fairseq_hybrid.timing.command_model import build, drawn, padded_tokens, timed
from fairseq_hybrid.timing.cpu_calibration import cpu_name

HOST_BOUND = ["--arch", "hybrid_lstm_tiny", "--encoder-layers", "4", "--decoder-layers", "4"]


def group_seconds(train, devices, workers, samples, leave: bool) -> float:
    """Seconds of the samples' steps of a fresh group, the trainer at every
    core; ``leave``: as the group leaves them, else kept."""
    torch.set_num_threads(os.cpu_count())
    keep = mock.patch("fairseq_hybrid.hybrid_group.leave_cores_to_devices", lambda plan: None)
    with (contextlib.nullcontext() if leave else keep):
        _, _, model, criterion = build(train, devices, {"workers": workers}, with_batches=False)
        try:
            return timed(model, criterion, torch.optim.Adam(model.parameters(), lr=1e-3), samples, 2, "cpu")
        finally:
            if model.hybrid_group.stages is not None:
                model.hybrid_group.stages.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None, help="default 1000 with --host-bound, else 2000")
    parser.add_argument("--host-bound", action="store_true", help="hybrid_lstm_tiny, 4 + 4 layers")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="results/trainer_threads", help="writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    max_tokens = args.max_tokens or (1000 if args.host_bound else 2000)
    train = [args.data, "--max-tokens", str(max_tokens), "--source-lang", "ja", "--target-lang", "en",
             "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
             *(HOST_BOUND if args.host_bound else ["--arch", "hybrid_lstm_base"])]
    task, cfg, _, _ = build(train, ["cpu"])
    samples = drawn(task, cfg, args.batches)
    tokens = padded_tokens(samples)
    devices = ["cpu"] * args.devices
    rows = []
    for workers in ("threads", "processes"):
        kept, left = [], []
        for round_index in range(args.rounds):
            kept.append(tokens / group_seconds(train, devices, workers, samples, leave=False))
            left.append(tokens / group_seconds(train, devices, workers, samples, leave=True))
            print(f"round {round_index + 1}: {workers}: trainer at {os.cpu_count()} threads {kept[-1]:,.0f}, "
                  f"as the group leaves them {left[-1]:,.0f} tokens/s", flush=True)
        rows.append({"workers": workers, "kept_tokens_per_s": kept, "left_tokens_per_s": left,
                     "ratio": max(left) / max(kept)})
    report = {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "cores": os.cpu_count(),
              "devices": args.devices, "model": "hybrid_lstm_tiny, 4 + 4 layers" if args.host_bound else "hybrid_lstm_base",
              "max_tokens": max_tokens, "batches": args.batches, "rounds": args.rounds, "rows": rows}
    lines = ["| workers | trainer at every core | as the group leaves it | ratio |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {row['workers']} | {max(row['kept_tokens_per_s']):,.0f} | {max(row['left_tokens_per_s']):,.0f} | "
              f"{row['ratio']:.2f}x |" for row in rows]
    lines += ["", f"Padded source + target tokens/s, the faster of {args.rounds} alternating rounds of {args.batches} "
              f"steps (after 2) each; a group of {args.devices} CPU devices, {report['model']}, --max-tokens "
              f"{max_tokens}, Tatoeba batches; {report['cpu']}, {report['cores']} cores; {report['date']} "
              "(`benchmarks/bench_trainer_threads.py`)."]
    text = "\n".join(lines) + "\n"
    print(text)
    write_report(report, args.out + ".json", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
