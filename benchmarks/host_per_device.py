"""Who issues the cells, priced: one group of 4 on 4 GPUs with its host
time read four ways, at a fixed global batch and the paper's way.

The readings of the group's host (one GPU and DDP keep the measured host
of one process each, whatever the row):

* ``queued``: one process queues every device's cells (``--hybrid-workers
  threads``), the simulator's ``host_queues``;
* ``per-device``: a process per device (``--hybrid-workers processes``);
* ``per-device, a third``: the same at a third of the host time per call;
* ``free``: no host time at all (the ceiling).

Each row is the race (:func:`fairseq_hybrid.forecasts.race.race`) at a
global batch B of 50 + 50-token sentences: tokens/s over one GPU at B, and
over DDP at B/4 per GPU; then the paper's measure, 4 GPUs at 4 times one
GPU's batch against one GPU at its own (B = 4 x 128 against 128): per
sentence, the speed of DDP at 128 per GPU and of the group at 512 over one
GPU at 128.  Every figure is predicted: no two GPUs have run this code.

  python benchmarks/host_per_device.py --cost-file docs/bench/cost_file_h200.json \\
      --sets a100,v100 --out docs/bench
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Dict, List

from fairseq_hybrid.harness.measuring import write_report
from fairseq_hybrid.forecasts import cost_file
from fairseq_hybrid.forecasts.gpu_costs import PUBLISHED_SETS, set_tokens_per_s
from fairseq_hybrid.forecasts.race import race, set_costs_of, uniform_batch
from fairseq_hybrid.planning.chunk_choice import SOFTMAX_CHUNK_COUNTS
from fairseq_hybrid.planning.twin_model import twin_model

SOURCE = TARGET = 50
ONE_GPU_BATCH = 128  # the paper's measure: one GPU at this batch, 4 GPUs at 4 times it

# (name, host model, factor on the group's host time per call)
READINGS = [("one process (threads, today)", "queued", 1.0),
            ("a process per device", "per-device", 1.0),
            ("a process per device, a third of the host per call", "per-device", 1 / 3),
            ("free host (the ceiling)", "per-device", 0.0)]


def scaled(costs, factor: float):
    """``costs`` with the group's host time per call times ``factor`` (one
    device's, which one GPU and DDP are priced with, as it is)."""
    if factor == 1.0:
        return costs

    def of(k: int):
        group, one = costs(k)
        return dataclasses.replace(group, fixed={key: value * factor for key, value in group.fixed.items()}), one
    return of


def table_of(model, cfg, costs_for, batches: List[int], gpus: int, progress,
             softmax_chunks=SOFTMAX_CHUNK_COUNTS) -> Dict:
    """Every reading's group of ``gpus`` over one GPU and over DDP at each
    global batch, and the paper's measure."""
    rows = []
    for label, host_model, factor in READINGS:
        costs = scaled(costs_for(host_model), factor)
        row = {"reading": label, "host_model": host_model, "host_factor": factor, "batches": {}}
        memo: Dict = {}
        for sentences in batches:
            priced = race(model, cfg, costs, gpus, sentences, SOURCE, TARGET, group_sizes=[gpus], memo=memo,
                          softmax_chunks=softmax_chunks)
            one, ddp, group = priced[0], priced[1], priced[-1]
            row["batches"][str(sentences)] = {"group_vs_one": group.speedup_over(one),
                                              "group_vs_ddp": ddp.step.total / group.step.total,
                                              "ddp_vs_one": ddp.speedup_over(one), "choice": group.choice}
            progress(f"{label}, B = {sentences}: {group.speedup_over(one):.2f}x one GPU "
                     f"({ddp.step.total / group.step.total:.2f} of DDP)")
        # the paper's measure: per-sentence speed at 4 x 128 on 4 GPUs over one GPU at 128
        small = race(model, cfg, costs, 1, ONE_GPU_BATCH, SOURCE, TARGET)[0]
        large = race(model, cfg, costs, gpus, gpus * ONE_GPU_BATCH, SOURCE, TARGET, group_sizes=[gpus], memo=memo,
                     softmax_chunks=softmax_chunks)
        per_sentence = small.step.total / ONE_GPU_BATCH
        row["paper_measure"] = {"group": gpus * ONE_GPU_BATCH * per_sentence / large[-1].step.total,
                                "ddp": gpus * ONE_GPU_BATCH * per_sentence / large[1].step.total}
        progress(f"{label}, the paper's measure: group {row['paper_measure']['group']:.2f}x, "
                 f"DDP {row['paper_measure']['ddp']:.2f}x")
        rows.append(row)
    return {"rows": rows}


def markdown(report: Dict) -> str:
    lines = ["# Who issues the cells: one process or a process per device (predicted)", "",
             f"`benchmarks/host_per_device.py`: one group of {report['gpus']} on {report['gpus']} GPUs at a fixed "
             f"global batch B of {SOURCE} + {TARGET}-token sentences ({report['model']}); tokens/s over one GPU at B, "
             "in brackets over DDP at B/4 per GPU.  The paper's measure: 4 GPUs at 4 x 128 against one GPU at 128, "
             "per sentence.  One GPU and DDP keep one process's measured host.  A group's attention-softmax cells "
             f"take --hybrid-softmax-chunks among {', '.join(map(str, report.get('softmax_chunks', [1])))} "
             "(the fastest; 0: all of a micro-batch's chunks).  Predicted: no two GPUs have run this code.", ""]
    for name, table in report["sets"].items():
        batches = list(table["rows"][0]["batches"])
        lines += [f"## {name}", "", "| host for the group | " + " | ".join(f"B = {b}" for b in batches)
                  + " | paper's measure: group (DDP) |",
                  "| --- | " + " | ".join("---:" for _ in batches) + " | ---: |"]
        for row in table["rows"]:
            cells = [f"{row['batches'][b]['group_vs_one']:.2f}x ({row['batches'][b]['group_vs_ddp']:.2f})"
                     for b in batches]
            paper = row["paper_measure"]
            lines.append(f"| {row['reading']} | " + " | ".join(cells)
                         + f" | {paper['group']:.2f}x ({paper['ddp']:.2f}x) |")
        lines.append("")
    return "\n".join(lines)


def names(text: str) -> List[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost-file", help="a cost file one GPU measured (benchmarks/gpu_check.py --phases calibrate)")
    parser.add_argument("--sets", type=names, default=["a100"], help="published cost sets too (default a100; none)")
    parser.add_argument("--host-cost", help="benchmarks/bench_host_cost.py --json output for the published sets "
                        "(default: 30 us per cell)")
    parser.add_argument("--batches", type=lambda text: [int(v) for v in names(text)], default=[64, 128, 256, 512])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--softmax-chunks", type=lambda text: [int(v) for v in names(text)],
                        default=list(SOFTMAX_CHUNK_COUNTS),
                        help="the --hybrid-softmax-chunks a group may take (default: what auto tries, "
                        f"{','.join(map(str, SOFTMAX_CHUNK_COUNTS))})")
    parser.add_argument("--name", default="host_per_device", help="the reports' name in --out (.json, .md)")
    parser.add_argument("--out", help="folder for the reports")
    args = parser.parse_args(argv)
    for name in args.sets:
        if name != "none" and name not in PUBLISHED_SETS:
            parser.error(f"--sets {name!r}: each one of {', '.join(PUBLISHED_SETS)}")
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    reference = uniform_batch(ONE_GPU_BATCH, SOURCE, TARGET)
    started = time.time()

    def progress(text: str) -> None:
        print(f"[{time.time() - started:.0f} s] {text}", flush=True)

    report: Dict = {"gpus": args.gpus, "model": "hybrid_lstm_paper", "softmax_chunks": args.softmax_chunks,
                    "sets": {}}
    sets = {}
    if args.cost_file:
        measured = cost_file.register(args.cost_file)
        sets[f"measured ({measured.measured_on})"] = (measured.name, measured.path, measured.tokens_per_s)
    for name in args.sets:
        if name != "none":
            sets[f"{name} set"] = (name, args.host_cost, set_tokens_per_s(name, None))
    for title, (name, path, tokens_per_s) in sets.items():
        def costs_for(host_model, name=name, path=path, tokens_per_s=tokens_per_s):
            return set_costs_of(name, model, cfg, reference, path, host_model, tokens_per_s)
        report["sets"][title] = table_of(model, cfg, costs_for, args.batches, args.gpus, progress,
                                         args.softmax_chunks)
    text = markdown(report)
    print(text)
    if args.out:
        write_report(report, os.path.join(args.out, f"{args.name}.json"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
