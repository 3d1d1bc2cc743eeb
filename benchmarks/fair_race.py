#!/usr/bin/env python3
"""The group against DDP under weak scaling, predicted: what a user with K
GPUs would compare (docs/benchmarks.md, "The fair race").

A user moving from one GPU to K under DDP keeps ``--max-tokens`` per GPU,
so a step trains K batches; a group given the same global batch trains
them on its K devices.  The schedule simulator prices both from the
engine's own cells: the dependency bound by micro-batches (default and
searched placement); the group at K x 128 sentences against DDP at 128 per
GPU under the P100 and A100 sets, the host time read per ``--host-models``;
with ``--data``, both on real batches (DDP's stragglers included); and
GNMT v2's published setting, DDP's calibration.  The race at a fixed global
batch is ``fair_race_global.py``.  Minutes, no training.

    .venv/bin/python benchmarks/fair_race.py --host-cost docs/bench/host_cost.json \\
        --data work/tatoeba_ja_en/bin --out docs/bench
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict

from fairseq_hybrid.forecasts.data_parallel_cost import (data_parallel_step, data_parallel_step_of, gradient_bytes,
                                                       owned_bytes, speedup)
from fairseq_hybrid.forecasts.gpu_costs import (GNMT_V100_DDP_4, GNMT_V100_TOKENS_PER_S, STEP_US, best_chunk_length,
                                               predicted_step, set_costs, set_rate)
from fairseq_hybrid.candidates.group_search import best_group, chosen, searched
from fairseq_hybrid.candidates.race import set_costs_of
from fairseq_hybrid.forecasts.real_batches import as_batch, ddp_on_real_batches, tokens_of
from fairseq_hybrid.harness import measuring
from fairseq_hybrid.harness.measuring import host_models, integers, race_options, real_batch_lengths, write_report
from fairseq_hybrid.parallel import build_plan, build_step
from fairseq_hybrid.planning.schedule_simulator import CostModel, device_flops
from fairseq_hybrid.planning.twin_model import batch, twin_model

PER_GPU = (128, 50, 50)  # sentences, source and target tokens of one GPU's batch


def busiest_share(model, cfg, k: int, placement: str, sample, chunk_length: int, micro_batches: int) -> float:
    """The busiest device's share of the step's floating-point operations."""
    plan = build_plan(",".join(["cpu"] * k), placement, "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    built = build_step(model, plan, *sample, lambda *args: args, chunk_length, micro_batches)
    work = device_flops(built.step.cells, k)
    return max(work) / sum(work)


def bound_table(args, sample) -> Dict:
    rows = {}
    free = CostModel()
    for label, options in (("with the bidirectional layer", {}),
                           ("--encoder-bidirectional-layers 0", {"encoder_bidirectional_layers": 0})):
        model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary, **options)
        one = predicted_step(model, cfg, 1, "hybrid", free, *sample).total
        for micro_batches in args.micro_batches:
            row = {}
            default = ("",) + best_chunk_length(model, cfg, 4, "hybrid", free, *sample, lengths=args.lengths,
                                                micro_batches=micro_batches)
            for name, (placement, length, step) in (("default", default),
                                                    ("auto", searched(model, cfg, 4, free, sample, micro_batches,
                                                                      args.lengths))):
                row[name] = {"bound": one / step.total, "chunk_length": length, "placement": placement,
                             "busiest_share": busiest_share(model, cfg, 4, placement, sample, length, micro_batches)}
            rows[f"{label}, M={micro_batches}"] = row
            print(f"bound {label}, M={micro_batches}: default {row['default']['bound']:.2f}x, "
                  f"auto {row['auto']['bound']:.2f}x", flush=True)
    return rows


def groups_under_ddp(model, cfg, one, one_cost: CostModel, cost: CostModel, group: Dict, k: int,
                     groups: int) -> Dict:
    """``groups`` groups of ``k`` under DDP, each at ``group``'s step (its
    K x 128 sentences): the all-reduce runs between twins, so the device
    that owns the most parameters decides; beside DDP on all their GPUs."""
    owned = max(owned_bytes(model, cfg, k, group["placement"]))
    gpus = groups * k
    return {"ddp": speedup(one, data_parallel_step(one, gradient_bytes(model), gpus, one_cost), gpus),
            "group": speedup(one, data_parallel_step(group["step"], owned, groups, cost), gpus),
            **chosen(group)}


def race_table(args, host_model: str) -> Dict:
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    per_gpu = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    model_bytes = gradient_bytes(model)
    report: Dict = {}
    for name in ("p100", "a100"):
        costs = set_costs_of(name, model, cfg, per_gpu, args.host_cost, host_model, args.one_device_tokens_per_s)
        one_cost = costs(1)[1]
        one = predicted_step(model, cfg, 1, "hybrid", one_cost, *per_gpu)
        rows = {}
        for k in args.groups:
            sentences = k * PER_GPU[0]
            merged = batch(sentences, [PER_GPU[1]] * sentences, PER_GPU[2])
            cost = costs(k)[0]
            group = best_group(model, cfg, k, cost, merged, args.micro_batches, args.lengths)
            ddp = data_parallel_step(one, model_bytes, k, one_cost)
            rows[f"K={k}"] = {"ddp": speedup(one, ddp, k), "group": speedup(one, group["step"], k), **chosen(group)}
            if k == 2:  # on 4 GPUs: two groups of two, the other way to use them
                rows["2 groups x 2 (4 GPUs)"] = groups_under_ddp(model, cfg, one, one_cost, cost, group, 2, 2)
            if k == 4 and args.eight:
                rows["2 groups x 4 (8 GPUs)"] = groups_under_ddp(model, cfg, one, one_cost, cost, group, 4, 2)
            row = rows[f"K={k}"]
            print(f"{name} ({host_model} host) K={k}: DDP {row['ddp']:.2f}x, group {row['group']:.2f}x "
                  f"(M={group['micro_batches']}, chunk {group['chunk_length']})", flush=True)
            if k == 4 and args.plain:
                # the same race for the model without its bidirectional layer (an existing option), each side
                # against one device running that model
                plain, plain_cfg = twin_model("hybrid_lstm_paper", args.vocabulary, encoder_bidirectional_layers=0)
                plain_one = predicted_step(plain, plain_cfg, 1, "hybrid", one_cost, *per_gpu)
                plain_group = best_group(plain, plain_cfg, 4, cost, merged, args.micro_batches, args.lengths)
                rows["K=4, --encoder-bidirectional-layers 0"] = {
                    "ddp": speedup(plain_one, data_parallel_step(plain_one, gradient_bytes(plain), 4, one_cost), 4),
                    "group": speedup(plain_one, plain_group["step"], 4),
                    **chosen(plain_group)}
        report[name] = rows
    return report


def gnmt_calibration(args, per_gpu_batches=None) -> Dict:
    """The simulator in GNMT v2's published setting, against its DDP
    figure on 4 V100 (fp32, batch 128 per GPU, NVLink): a model of its
    shape (4 x 1024 LSTM, the bottom encoder layer bidirectional, 1024-wide
    embeddings, 32k vocabulary), the ``v100`` cost set with its FLOP rate
    solved for GNMT v2's one-V100 tokens/s, 128 sentences of 50 + 50 tokens
    per GPU; DDP ideal, DDP waiting for its slowest rank on real batches
    (with ``--data``), and a group of 4 at 4 x 128 beside them."""
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary, encoder_embed_dim=1024, decoder_embed_dim=1024)
    per_gpu = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    host_model = args.host_models[0]
    step_us = STEP_US["v100"]
    rate = set_rate("v100", model, cfg, per_gpu, args.host_cost, step_us, host_model, GNMT_V100_TOKENS_PER_S)
    group_cost, one_cost = set_costs("v100", args.host_cost, 4, step_us, rate, host_model)
    one = predicted_step(model, cfg, 1, "hybrid", one_cost, *per_gpu)
    model_bytes = gradient_bytes(model)
    report: Dict = {"published_ddp": list(GNMT_V100_DDP_4), "flop_rate": rate, "host_model": host_model,
                    "one_device_tokens_per_s": GNMT_V100_TOKENS_PER_S,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "ddp": speedup(one, data_parallel_step(one, model_bytes, 4, one_cost), 4)}
    if per_gpu_batches:
        steps = min(args.real_steps, len(per_gpu_batches) // 4)
        ones = [predicted_step(model, cfg, 1, "hybrid", one_cost, *as_batch([part])) for part in per_gpu_batches]
        report["ddp_real_batches"] = ddp_on_real_batches(ones, per_gpu_batches, 4, steps, model_bytes, one_cost)
    merged = batch(4 * PER_GPU[0], [PER_GPU[1]] * 4 * PER_GPU[0], PER_GPU[2])
    group = best_group(model, cfg, 4, group_cost, merged, args.micro_batches, args.lengths)
    report["group"] = speedup(one, group["step"], 4)
    report.update(chosen(group))
    print(f"GNMT v2's setting, 4 x V100: DDP {report['ddp']:.2f}x (published {GNMT_V100_DDP_4[0]}-"
          f"{GNMT_V100_DDP_4[1]}x), on real batches {report.get('ddp_real_batches', float('nan')):.2f}x; "
          f"group {report['group']:.2f}x", flush=True)
    return report


def straggler_table(args, placements: Dict[str, Dict[int, str]], per_gpu_batches) -> Dict:
    """DDP and the group on real batches, in tokens/s over one device's on
    the per-GPU batches: DDP's step takes K of them and waits for its
    slowest rank; the group's step takes a batch drawn at K x
    ``--max-tokens`` (what a user would give it: sentences of similar
    length), and, for comparison, the same K per-GPU batches merged (padded
    to the longest), each at its best count of micro-batches and chunk
    length (the placement found at equal batches).  With K = 2, also two
    groups of two under DDP on 4 GPUs, each step waiting for the slower
    group."""
    steps = args.real_steps
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    per_gpu = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    model_bytes = gradient_bytes(model)
    report: Dict = {"max_tokens": args.max_tokens, "steps": steps, "host_model": args.host_models[0],
                    "sentences_per_batch": sum(len(part[0]) for part in per_gpu_batches) / len(per_gpu_batches)}
    # a group's steps: for two groups of two under DDP, twice as many of K = 2's
    group_steps = {k: steps * (2 if k == 2 else 1) for k in args.groups}
    group_batches = {k: real_batch_lengths(args.data, k * args.max_tokens, group_steps[k]) for k in args.groups}
    for name in ("p100", "a100"):
        costs = set_costs_of(name, model, cfg, per_gpu, args.host_cost, args.host_models[0],
                             args.one_device_tokens_per_s)
        one_cost = costs(1)[1]
        ones = [predicted_step(model, cfg, 1, "hybrid", one_cost, *as_batch([part])) for part in per_gpu_batches]
        one_rate = tokens_of(per_gpu_batches) / sum(one.total for one in ones)  # tokens/s of one device
        rows = {}
        for k in args.groups:
            cost = costs(k)[0]

            def group_step(parts):
                return best_group(model, cfg, k, cost, as_batch(parts), args.micro_batches, (0, 0),
                                  placement=placements[name][k])["step"]

            own = [group_step([part]) for part in group_batches[k]]
            own_rate = tokens_of(group_batches[k][:steps]) / sum(step.total for step in own[:steps])
            merged = [group_step(per_gpu_batches[i * k:(i + 1) * k]) for i in range(group_steps[k])]
            merged_rate = tokens_of(per_gpu_batches[:steps * k]) / sum(step.total for step in merged[:steps])
            rows[f"K={k}"] = {"ddp": ddp_on_real_batches(ones, per_gpu_batches, k, steps, model_bytes, one_cost),
                              "group": own_rate / one_rate,
                              "group_merged": merged_rate / one_rate}
            print(f"{name} K={k} on real batches: DDP {rows[f'K={k}']['ddp']:.2f}x, group "
                  f"{rows[f'K={k}']['group']:.2f}x (the K batches merged: {rows[f'K={k}']['group_merged']:.2f}x)",
                  flush=True)
            if k == 2:
                # two groups of two under DDP on 4 GPUs: each step waits for the slower group
                owned = max(owned_bytes(model, cfg, 2, placements[name][2]))

                def under_ddp(steps_of, parts):
                    seconds = sum(data_parallel_step_of(steps_of[2 * i:2 * i + 2], owned, cost).total
                                  for i in range(steps))
                    return tokens_of(parts) / seconds / one_rate

                rows["2 groups x 2 (4 GPUs)"] = {
                    "ddp": ddp_on_real_batches(ones, per_gpu_batches, 4, steps, model_bytes, one_cost),
                    "group": under_ddp(own, group_batches[2]),
                    "group_merged": under_ddp(merged, per_gpu_batches[:4 * steps])}
                print(f"{name} 2 groups x 2 on real batches: {rows['2 groups x 2 (4 GPUs)']['group']:.2f}x",
                      flush=True)
        report[name] = rows
    return report


def markdown(report: Dict) -> str:
    lines = ["Dependency bound (every FLOP costs the same, nothing else costs) of a group of 4 at 4 x 128 "
             "sentences of 50 + 50 tokens against one device at 128, `hybrid_lstm_paper`, by micro-batches "
             "(`--hybrid-micro-batches`); the busiest device's share of the step's FLOPs beside each "
             "(`benchmarks/fair_race.py`):", "",
             "| model, micro-batches | default placement | busiest | `--hybrid-placement auto` | busiest |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, row in report["bounds"].items():
        default, auto = row["default"], row["auto"]
        lines.append(f"| {name} | {default['bound']:.2f}x | {default['busiest_share']:.1%} | {auto['bound']:.2f}x | "
                     f"{auto['busiest_share']:.1%} |")
    readings = {"queued": "the host queueing each cell ahead of the devices, one host for the group's workers "
                          "(one worker's host time per cell, measured on CPU, the LSTM kernel call as one op)",
                "per-device": "the host queueing each cell ahead of its device, one host (process) per device "
                              "(one worker's host time per cell, measured on CPU, the LSTM kernel call as one op)",
                "summed": "the host time per cell measured with K workers on CPU added to each cell's device time "
                          "(the pessimistic end)"}
    for host_model, by_set in report["race"].items():
        lines += ["", "Weak scaling (DDP keeps 128 sentences per GPU as GPUs are added; the group takes the same "
                  "global batch): DDP at 128 sentences per GPU, the group at K x 128 per step at its "
                  "best count of micro-batches and chunk length (placement by `--hybrid-placement auto`); speed-up "
                  f"in tokens/s over one GPU at 128; {readings[host_model]}:", "",
                  "| GPUs | P100 set: DDP | group | A100 set: DDP | group | group's M, chunk length (P100; A100) |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        for name in by_set["p100"]:
            p, a = by_set["p100"][name], by_set["a100"][name]
            lines.append(f"| {name} | {p['ddp']:.2f}x | {p['group']:.2f}x | {a['ddp']:.2f}x | {a['group']:.2f}x | "
                         f"{p['micro_batches']}, {p['chunk_length']}; {a['micro_batches']}, {a['chunk_length']} |")
        lines += ["", "Placements: " + "; ".join(f"{name} {row['placement'] or 'default'}"
                                                 for name, row in by_set["p100"].items())]
    lines += ["", "LSTM cells of fewer than 128 sentences run at a GPU's lower throughput there (DeepBench). Not in "
              "these figures: DDP's stragglers (below, on real batches)."]
    real = report.get("real_batches")
    if real:
        lines += ["", f"On real batches, drawn by fairseq's batch sampler ({real['steps']} steps; per GPU "
                  f"`--max-tokens {real['max_tokens']}`, {real['sentences_per_batch']:.0f} sentences a batch on "
                  f"average; host {real['host_model']}): DDP's ranks each take a batch and wait for the slowest; "
                  "the group takes a batch of K x `--max-tokens` (in brackets: the same K batches merged, padded "
                  "to the longest), two groups of two each a batch of 2 x `--max-tokens` and the step waits for "
                  "the slower; tokens/s over one GPU's on the per-GPU batches:", "",
                  "| GPUs | P100 set: DDP | group | A100 set: DDP | group |", "| --- | ---: | ---: | ---: | ---: |"]
        for name in real["p100"]:
            p, a = real["p100"][name], real["a100"][name]
            lines.append(f"| {name} | {p['ddp']:.2f}x | {p['group']:.2f}x ({p['group_merged']:.2f}x) | "
                         f"{a['ddp']:.2f}x | {a['group']:.2f}x ({a['group_merged']:.2f}x) |")
    gnmt = report.get("gnmt_v100")
    if gnmt:
        real = f"{gnmt['ddp_real_batches']:.2f}x" if "ddp_real_batches" in gnmt else "not run (no `--data`)"
        lines += ["", "Calibration in GNMT v2's published setting (4 x V100, fp32, NVLink, 128 sentences per GPU; a "
                  f"model of its shape, {gnmt['parameters'] / 1e6:.0f}M parameters; FLOP rate "
                  f"{gnmt['flop_rate'] / 1e12:.1f} TFLOP/s solved for its {gnmt['one_device_tokens_per_s'] / 1e3:.2f}k "
                  f"tokens/s on one V100; host {gnmt['host_model']}):", "",
                  "| | speed-up on 4 GPUs |", "| --- | ---: |",
                  f"| published, DDP | {gnmt['published_ddp'][0]:.2f}-{gnmt['published_ddp'][1]:.2f}x |",
                  f"| predicted, DDP at 128 x 50 + 50 per GPU | {gnmt['ddp']:.2f}x |",
                  f"| predicted, DDP waiting for its slowest rank on the real batches above | {real} |",
                  f"| predicted, group of 4 at 4 x 128 (M = {gnmt['micro_batches']}, chunk length "
                  f"{gnmt['chunk_length']}) | {gnmt['group']:.2f}x |"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    race_options(parser)
    parser.add_argument("--groups", type=integers, default=[2, 4], help="group sizes K (default 2,4)")
    parser.add_argument("--no-eight", dest="eight", action="store_false", help="leave out 2 groups x 4 on 8 GPUs")
    parser.add_argument("--no-plain", dest="plain", action="store_false",
                        help="leave out K = 4 without the bidirectional layer (--encoder-bidirectional-layers 0)")
    parser.add_argument("--data", help="a binarized ja-en corpus: also race on its batches, DDP's stragglers included")
    parser.add_argument("--max-tokens", type=int, default=6400, help="per GPU, for --data (default 6400: 128 x 50)")
    parser.add_argument("--real-steps", type=int, default=8, help="steps of K real batches each (default 8)")
    parser.add_argument("--host-models", type=host_models, default=["queued", "summed"],
                        help="how the host time is priced, the first also on real batches (default queued,summed: "
                        "queued ahead of the devices on one host shared by the workers; summed with the device "
                        "time, the pessimistic end; per-device: queued, one host per device, as "
                        "--hybrid-workers processes runs)")
    parser.add_argument("--no-gnmt", dest="gnmt", action="store_false",
                        help="leave out the calibration in GNMT v2's published setting (4 x V100)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.data and not os.path.isdir(args.data):
        parser.error(f"--data {args.data}: {measuring.NO_DATA}")
    started = time.time()
    sample = batch(4 * PER_GPU[0], [PER_GPU[1]] * 4 * PER_GPU[0], PER_GPU[2])
    report = {"bounds": bound_table(args, sample),
              "race": {host_model: race_table(args, host_model) for host_model in args.host_models}}
    per_gpu_batches = None
    if args.data:
        per_gpu_batches = real_batch_lengths(args.data, args.max_tokens, args.real_steps * max(args.groups + [4]))
        placements = {name: {k: rows[f"K={k}"]["placement"] for k in args.groups}
                      for name, rows in report["race"][args.host_models[0]].items()}
        report["real_batches"] = straggler_table(args, placements, per_gpu_batches)
    if args.gnmt:
        report["gnmt_v100"] = gnmt_calibration(args, per_gpu_batches)
    report["minutes"] = (time.time() - started) / 60
    text = markdown(report)
    print(text)
    if args.out:
        write_report(report, os.path.join(args.out, "fair_race.json"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
