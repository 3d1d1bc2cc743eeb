#!/usr/bin/env python3
"""What a process per device costs beyond its cells, for the GPU forecasts
(``fairseq_hybrid.forecasts.gpu_costs.as_built_processes``): a stage's
build of a ``hybrid_lstm_paper`` step (its parameter-free twin, 128
sentences of 50 + 50 tokens and the other batches given), a header over
gloo and the host wire's message (the GPU wire's header goes through the
same pipes) at each end, and a command's round
trip carrying that batch, each measured on this machine's CPU
(``fairseq_hybrid.timing.worker_costs``).  A time: run it alone.

    .venv/bin/python benchmarks/bench_worker_costs.py --json fairseq_hybrid/forecasts/worker_costs.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from fairseq_hybrid.planning.twin_model import batch, twin_model
from fairseq_hybrid.timing.cpu_calibration import cpu_name
from fairseq_hybrid.timing.worker_costs import build_costs, wire_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="hybrid_lstm_paper")
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--sentences", type=int, nargs="+", default=[128, 64, 256])
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--json", help="write the measurement here")
    args = parser.parse_args()
    model, cfg = twin_model(args.arch, args.vocabulary)
    samples = []
    for sentences in args.sentences:
        net_input, target = batch(sentences, [args.length] * sentences, args.length)
        samples.append({"net_input": net_input, "target": target})
    layers = (cfg.encoder_layers, cfg.decoder_layers)
    build = build_costs(model, layers, samples, chunk_lengths=(0, 10), repeats=5)
    command_bytes = sum(value.numel() * value.element_size() for value in samples[0]["net_input"].values())
    gloo = wire_costs("gloo header", command_bytes)
    host = wire_costs("host", command_bytes)
    report = {"what": "a process per device's costs beyond its cells (benchmarks/bench_worker_costs.py): a "
                      "stage's build fitted as fixed + per cell of the step + per cell of its own, seconds; "
                      "host seconds of a message at each end (gloo_header: a header over gloo, as the GPU wire sent "
                      "them before; host: the host wire's pipes, through which the GPU wire's headers go, "
                      "NCCL's call not in it); a command's round trip carrying the batch",
              "measured_on": f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
                             f"{time.strftime('%Y-%m-%d')}",
              "workload": f"{args.arch} twin, {', '.join(map(str, args.sentences))} sentences of {args.length} + "
                          f"{args.length} tokens, groups of 2 and 4, chunk lengths 0 and 10",
              **build, "command_round_trip": gloo["command_round_trip"],
              "gloo_header": {key: gloo[key] for key in ("message_send", "message_receive")},
              "host_wire": {key: host[key] for key in ("message_send", "message_receive")}}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
