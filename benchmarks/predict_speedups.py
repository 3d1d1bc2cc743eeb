#!/usr/bin/env python3
"""Predicted speed-up over one GPU of the hybrid group, pure model and pure
data parallelism in one group, and plain DDP (what a fairseq user has
today), in the paper's setting: ``hybrid_lstm_paper``, 32k vocabulary, 128
sentences of 50 + 50 tokens per GPU (DDP) or per group (the group's modes).

The schedule simulator replays the engine's own cells
(``fairseq_hybrid/planning/schedule_simulator.py``); DDP is one device's
step with a bucketed ring all-reduce overlapped with backward
(``fairseq_hybrid/forecasts/data_parallel_cost.py``).  Two assumption sets:

* ``p100``: the simulator's defaults (9.3 TFLOP/s fp32 at 50%, 20 us per
  LSTM time step forward and 40 backward, 5 ms per step outside the cells,
  PCIe 12 GB/s and 10 us per transfer);
* ``a100``: the one-device rate taken from NVIDIA's GNMT v2 (PyTorch,
  DeepLearningExamples README: 83.2k tokens/s, source + target, on one
  A100 in TF32 at batch 128), solved for the FLOP rate that gives
  hybrid_lstm_paper that time per step with the other costs below (or
  from ``--one-device-tokens-per-s``, measured on a GPU at hand by
  ``benchmarks/gpu_check.py --phases calibrate``); 10 us
  per LSTM time step (5, 10 and 20 us in the sensitivity rows); 3 ms per
  step outside the cells (Adam over 146M fp32 parameters at about 1.5 TB/s);
  NVLink 3 at 210 GB/s (70% of the A100 SXM's 300 GB/s each way) and 10 us
  per transfer.

Both take the host time per cell from ``--host-cost`` (the JSON of
``benchmarks/bench_host_cost.py``: the cell's own call plus the engine's time
outside the cells, per cell, on the CPU it ran on) in place of an assumed
cost per cell call.  On a GPU the host queues ops asynchronously: by
default (``--host-model queued``) each cell's host time is spent on one
host shared by the group's worker threads (the GIL) and its device time
starts once it is queued; one worker's measured host time is used, with
the CPU's LSTM kernel call counted as one op (oneDNN does the layer's work
inside that call; cuDNN's only queues).  ``--host-model summed`` adds the
host time measured with K workers to each cell's device time, the
pessimistic end; the host table shows both.

Both price an LSTM cell of fewer than 128 sentences at the lower
throughput a GPU reaches there (Baidu DeepBench's V100 LSTM,
``fairseq_hybrid/forecasts/lstm_batch_efficiency.json``).

The dependency bound beside each figure is the same replay where every
floating-point operation costs the same and nothing else costs anything.
The bound is also given without two dependencies of today's model: the
decoder's initial state waiting for the encoder's last chunk, and the
bottom encoder layer's reverse direction (``--encoder-bidirectional-layers
0``).

    .venv/bin/python benchmarks/predict_speedups.py --host-cost docs/bench/host_cost.json --out docs/bench

Writes speedups.json and speedups.md into --out.  Seconds: no training.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

from fairseq_hybrid.harness.measuring import write_report
from fairseq_hybrid.parallel import Cell
from fairseq_hybrid.forecasts.data_parallel_cost import data_parallel_step, gradient_bytes, owned_bytes, speedup
from fairseq_hybrid.planning.twin_model import batch, twin_model
from fairseq_hybrid.forecasts.gpu_costs import (GNMT_A100_TOKENS_PER_S, HOST_MODELS, STEP_US, best_chunk_length,
                                               cost_set, group_host, host_fixed, predicted_step, rate_of, set_costs,
                                               set_rate)
from fairseq_hybrid.planning.schedule_simulator import CostModel


def without_decoder_initial_state(cells: List[Cell]) -> List[Cell]:
    """The cells with decoder layers starting from zeros: chunk 0 of each
    decoder layer no longer waits for an encoder layer's last chunk."""
    names = [cell.name for cell in cells]
    out = []
    for cell in cells:
        if cell.name.startswith("decoder layer"):
            kept = [ref for ref in cell.inputs if not names[ref[0]].startswith("encoder")]
            cell = cell._replace(inputs=kept)
        out.append(cell)
    return out


def table(args) -> Dict:
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    plain, plain_cfg = twin_model("hybrid_lstm_paper", args.vocabulary, encoder_bidirectional_layers=0)
    sample = batch(128, [50] * 128, 50)
    model_bytes = gradient_bytes(model)
    report: Dict = {"assumptions": {}, "rows": {}, "bounds": {}, "sensitivity": {}}
    free = CostModel()

    def bound(k, mode, the_model=model, the_cfg=cfg, transform=None):
        base = predicted_step(the_model, the_cfg, 1, "hybrid", free, *sample).total
        if mode == "ddp":
            return float(k)
        best = best_chunk_length(the_model, the_cfg, k, mode, free, *sample, transform)[1].total
        return base / best

    for k in (2, 4):
        for mode in ("hybrid", "model", "data", "ddp"):
            report["bounds"][f"{mode} K={k}"] = bound(k, mode)
    report["bounds"]["hybrid K=4, decoder from zeros"] = bound(4, "hybrid", transform=without_decoder_initial_state)
    report["bounds"]["hybrid K=4, no bidirectional layer"] = bound(4, "hybrid", plain, plain_cfg)
    report["bounds"]["hybrid K=4, both"] = bound(4, "hybrid", plain, plain_cfg, without_decoder_initial_state)

    for name in ("p100", "a100"):
        step_us = STEP_US[name]
        rows = {}
        # the one-device rate: given (P100) or solved for the one-device tokens/s (GNMT v2's one-A100
        # figure unless measured) with one worker's host cost
        rate = set_rate(name, model, cfg, sample, args.host_cost, step_us, args.host_model,
                        args.one_device_tokens_per_s)
        _, one_cost = set_costs(name, args.host_cost, 1, step_us, rate, args.host_model)
        one = predicted_step(model, cfg, 1, "hybrid", one_cost, *sample)
        plain_one = predicted_step(plain, plain_cfg, 1, "hybrid", one_cost, *sample)
        report["assumptions"][name] = {"flop_rate": rate, "per_step_us": step_us, "host_model": args.host_model,
                                       "host_us_per_cell": {key: v * 1e6 for key, v in one_cost.fixed.items()},
                                       "one_device_step_ms": one.total * 1e3}
        if name == "a100":
            report["assumptions"][name]["one_device_tokens_per_s"] = args.one_device_tokens_per_s
        for k in (2, 4):
            cost, _ = set_costs(name, args.host_cost, k, step_us, rate, args.host_model)
            for mode in ("hybrid", "model", "data"):
                length, step = best_chunk_length(model, cfg, k, mode, cost, *sample)
                rows[f"{mode} K={k}"] = {"speedup": one.total / step.total, "chunk_length": length}
            ddp = data_parallel_step(one, model_bytes, k, one_cost)  # K processes, each one device's host cost
            rows[f"ddp K={k}"] = {"speedup": speedup(one, ddp, k)}
            if k == 4:
                length, group = best_chunk_length(model, cfg, 4, "hybrid", cost, *sample)
                two_groups = data_parallel_step(group, max(owned_bytes(model, cfg, 4)), 2, cost)
                rows["hybrid 2 groups x 4 under DDP (8 GPUs)"] = {"speedup": speedup(one, two_groups, 2) * 1.0,
                                                                  "chunk_length": length}
                rows["ddp K=8"] = {"speedup": speedup(one, data_parallel_step(one, model_bytes, 8, one_cost), 8)}
                length, plain_group = best_chunk_length(plain, plain_cfg, 4, "hybrid", cost, *sample)
                rows["hybrid K=4, --encoder-bidirectional-layers 0"] = {
                    "speedup": plain_one.total / plain_group.total, "chunk_length": length}
                # what-if: the replicas' parameter and gradient copies free (the engine overlaps them
                # with the cells; this is what is left when the links never hold a cell up)
                length, hidden = best_chunk_length(model, cfg, 4, "hybrid", cost, *sample, replica_copies=False)
                rows["hybrid K=4, replica copies free (what-if)"] = {"speedup": one.total / hidden.total,
                                                                       "chunk_length": length}
        report["rows"][name] = rows
        sensitivity = {}
        for latency in (5.0, 10.0, 20.0):
            rate = set_rate(name, model, cfg, sample, args.host_cost, latency, args.host_model,
                            args.one_device_tokens_per_s)
            cost, cost_one = set_costs(name, args.host_cost, 4, latency, rate, args.host_model)
            one = predicted_step(model, cfg, 1, "hybrid", cost_one, *sample)
            _, group = best_chunk_length(model, cfg, 4, "hybrid", cost, *sample)
            ddp = data_parallel_step(one, model_bytes, 4, cost_one)
            sensitivity[f"{latency:g} us"] = {"hybrid K=4": one.total / group.total, "ddp K=4": speedup(one, ddp, 4)}
        report["sensitivity"][name] = sensitivity
        by_host = {}
        for label, fixed, fixed_one, queues in host_readings(args.host_cost):
            rate = rate_of(name, model, cfg, sample, fixed_one, step_us, queues, args.one_device_tokens_per_s)
            cost = cost_set(name, fixed, step_us, rate, host_queues=queues)
            cost_one = cost_set(name, fixed_one, step_us, rate, host_queues=queues)
            one = predicted_step(model, cfg, 1, "hybrid", cost_one, *sample)
            plain_one = predicted_step(plain, plain_cfg, 1, "hybrid", cost_one, *sample)
            _, group = best_chunk_length(model, cfg, 4, "hybrid", cost, *sample)
            _, plain_group = best_chunk_length(plain, plain_cfg, 4, "hybrid", cost, *sample)
            ddp = data_parallel_step(one, model_bytes, 4, cost_one)
            by_host[label] = {"hybrid K=4": one.total / group.total, "ddp K=4": speedup(one, ddp, 4),
                              "hybrid K=4, no bidirectional layer": plain_one.total / plain_group.total}
        report.setdefault("host_sensitivity", {})[name] = by_host
    return report


def host_readings(path):
    """The host time per cell of the sensitivity table: ``(label, group's
    seconds per cell, one device's, queued on one host?)``.  The measured
    rows: one worker's host time queued ahead of the devices (the cells'
    kernels, with the CPU's LSTM kernel call as one op, as a GPU's cuDNN
    call only queues; the tables above), the same with that call as
    measured, and the pessimistic sums of host and device time per cell at
    one worker's and at four workers' host time (four workers on this
    machine's cores: waiting for a core as well as for the GIL)."""
    flat = {key: 0.0 for key in host_fixed(None, 4)}
    rows = [("0 (free host)", flat, flat, True),
            ("30 us, queued on one host", host_fixed(None, 4), host_fixed(None, 1), True)]
    if path:
        queued, _ = group_host(path, 1, "queued")
        one, four = host_fixed(path, 1), host_fixed(path, 4)
        rows += [("measured at K = 1, queued on one host (the tables above)", queued, queued, True)]
        if queued != one:
            rows += [("measured at K = 1, queued, the LSTM kernel call as measured", one, one, True)]
        rows += [("measured at K = 1, summed with the device time", one, one, False),
                 ("measured at K = 4, summed with the device time (pessimistic)", four, one, False)]
    return rows


def markdown(report: Dict) -> str:
    bounds = report["bounds"]
    lines = ["Predicted speed-up over one GPU, `hybrid_lstm_paper`, 32k vocabulary, 128 sentences of 50 + 50 "
             "tokens per GPU (DDP) or per group (hybrid, model, data); each group figure at its best chunk "
             "length among `--hybrid-chunk-length auto`'s candidates (in brackets: P100; A100; none: K chunks; "
             "`benchmarks/predict_speedups.py`).", "",
             "| system | P100 set | A100 set | dependency bound |", "| --- | ---: | ---: | ---: |"]
    names = list(report["rows"]["p100"])
    for name in names:
        p100, a100 = report["rows"]["p100"][name], report["rows"]["a100"][name]
        chunk = (f" (chunk length {p100['chunk_length']}; {a100['chunk_length']})"
                 if p100.get("chunk_length") or a100.get("chunk_length") else "")
        key = name if name in bounds else "hybrid K=4, no bidirectional layer" if "bidirectional" in name else None
        lines.append(f"| {name}{chunk} | {p100['speedup']:.2f}x | {a100['speedup']:.2f}x | "
                     f"{bounds[key]:.2f}x |" if key else
                     f"| {name}{chunk} | {p100['speedup']:.2f}x | {a100['speedup']:.2f}x | |")
    lines += ["", "Per LSTM time step latency (hybrid and DDP at K = 4):", "",
              "| latency | P100 set: hybrid | DDP | A100 set: hybrid | DDP |", "| --- | ---: | ---: | ---: | ---: |"]
    for latency in report["sensitivity"]["p100"]:
        p, a = report["sensitivity"]["p100"][latency], report["sensitivity"]["a100"][latency]
        lines.append(f"| {latency} | {p['hybrid K=4']:.2f}x | {p['ddp K=4']:.2f}x | {a['hybrid K=4']:.2f}x | "
                     f"{a['ddp K=4']:.2f}x |")
    lines += ["", "Host time per cell (hybrid at K = 4, with and without the bidirectional bottom layer, and DDP):",
              "", "| host time per cell | P100 set: hybrid | without bidirectional layer | DDP | A100 set: hybrid | "
              "without | DDP |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label in report["host_sensitivity"]["p100"]:
        p, a = report["host_sensitivity"]["p100"][label], report["host_sensitivity"]["a100"][label]
        lines.append(f"| {label} | {p['hybrid K=4']:.2f}x | {p['hybrid K=4, no bidirectional layer']:.2f}x | "
                     f"{p['ddp K=4']:.2f}x | {a['hybrid K=4']:.2f}x | {a['hybrid K=4, no bidirectional layer']:.2f}x | "
                     f"{a['ddp K=4']:.2f}x |")
    lines += ["", "Dependency bound of hybrid at K = 4 with today's dependencies and without them (what-if "
              "replays of the cells; `--encoder-bidirectional-layers 0` is an existing model option, a decoder "
              "starting from zeros is not):", "", "| cells | bound |", "| --- | ---: |"]
    for name in ("hybrid K=4", "hybrid K=4, decoder from zeros", "hybrid K=4, no bidirectional layer",
                 "hybrid K=4, both"):
        lines.append(f"| {name} | {bounds[name]:.2f}x |")
    assumptions = report["assumptions"]
    lines += ["", "Assumptions: " + "; ".join(
        f"{name}: {a['flop_rate'] / 1e12:.1f} TFLOP/s effective, {a['per_step_us']:g} us per LSTM time step, host "
        f"{a['host_us_per_cell']['lstm/forward']:.0f} us per LSTM cell forward ({a['host_model']}), one device's "
        f"step {a['one_device_step_ms']:.1f} ms" for name, a in assumptions.items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host-cost", help="benchmarks/bench_host_cost.py --json output (default: 30 us per cell)")
    parser.add_argument("--one-device-tokens-per-s", type=float, default=GNMT_A100_TOKENS_PER_S,
                        help="the A100 set's one-device rate, source + target tokens/s of hybrid_lstm_paper at 128 "
                        "sentences of 50 + 50 (default: GNMT v2's 83.2k on one A100; benchmarks/gpu_check.py's "
                        "calibrate phase measures it on the GPU at hand)")
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--host-model", choices=HOST_MODELS, default="queued",
                        help="queued: the host queues each cell ahead of the devices, one host for the group's "
                        "workers (default); summed: host time added to each cell's device time (pessimistic)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    report = table(args)
    text = markdown(report)
    print(text)
    if args.out:
        write_report(report, os.path.join(args.out, "speedups.json"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
