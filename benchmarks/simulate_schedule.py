#!/usr/bin/env python3
"""Predict the speed-up of hybrid, pure model-parallel and pure
data-parallel training for K devices by replaying the engine's schedule.

1. Calibrate on this machine: train ``hybrid_lstm_base`` on one CPU device
   (one thread) through the engine on Tatoeba batches, record every cell's
   time and fit a cost model (rate and fixed cost per kind of cell and
   phase, step overhead outside the cells).
2. Validate: predict the K = 2 CPU speed-ups on the same batches as
   ``benchmarks/bench_suite.py`` (which runs this script after its own
   measurements) and set them beside its measurements
   (``--measured``), using the machine's measured contention (its ceiling).
3. Predict K = 1, 2, 4, 8 on this machine's cost model, and the paper's
   setting (4 GPUs, ``hybrid_lstm_paper``) under stated GPU assumptions.

First, and alone with ``--bound-only`` (seconds, no calibration), the
dependency bound: the speed-up the cells' dependencies allow when every
floating-point operation costs the same and nothing else costs anything.

The ``--json`` file also serves ``fairseq-train --hybrid-placement auto
--hybrid-cost-model FILE``: the placement is then chosen under these
measured costs.

  python benchmarks/simulate_schedule.py work/tatoeba_ja_en/bin --measured bench.json --json simulation.json
"""

import argparse
import json
import logging

import torch

from fairseq_hybrid.harness.measuring import batches, build, preset_args, suite_systems, train_steps, write_report
from fairseq_hybrid.parallel import AUTO, build_plan
from fairseq_hybrid.planning.chunk_choice import ChunkLengthChooser
from fairseq_hybrid.timing.cpu_calibration import fitted_cost
from fairseq_hybrid.forecasts.gpu_costs import KINDS, PHASES, gpu_cost_model, predicted_step
from fairseq_hybrid.planning.placement_search import best_placement
from fairseq_hybrid.planning.twin_model import batch, twin_model
from fairseq_hybrid.planning.schedule_simulator import CostModel

MODES = ("hybrid", "model", "data")


def calibrate(data, samples, arch, chunk_lengths=(0, 4), group_threads=2):
    """Fit a cost model to one CPU device running the engine, one thread,
    on the batches (the first two a warm-up), the time outside the cells
    also with ``group_threads`` as a group's main thread runs it
    (:func:`fairseq_hybrid.timing.cpu_calibration.fitted_cost`)."""
    torch.set_num_threads(1)
    task, model, criterion = build(data, preset_args(arch, "cpu"))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_steps(model, criterion, optimizer, samples[:2])
    cost = fitted_cost(model, criterion, optimizer, samples[2:], chunk_lengths, threads=1,
                       group_threads=group_threads, what=arch)
    return cost, model


def validation_system(name, row, k):
    """``(mode, placement, micro_batches)`` of a measured group of the
    benchmark suite, or None for the other systems (rows written before the
    suite recorded them are looked up among its systems by name)."""
    system = {s.name: s for s in suite_systems(k)}.get(name)
    kind = row.get("kind", system.kind if system else "")
    if kind != "group":
        return None
    return (row.get("mode", system.mode if system else ""), row.get("placement", system.placement if system else ""),
            row.get("micro_batches", system.micro_batches if system else "") or "1")


def net_input_of(sample):
    net_input = {key: sample["net_input"][key] for key in ("src_tokens", "src_lengths", "prev_output_tokens")}
    return net_input, sample["target"]


def predicted_seconds(model, cfg, k, mode, placement, cost, samples, chunk_length=0, micro_batches="1"):
    """The simulated seconds of the steps of ``samples`` under ``cost``;
    with ``micro_batches="auto"`` each at the count the group chose when it
    ran (under its own default cost model: the suite gives it no
    ``--hybrid-cost-model``)."""
    chooser = None
    if micro_batches == AUTO:
        plan = build_plan(",".join(["cpu"] * k), placement, mode, cfg.encoder_layers, cfg.decoder_layers)
        chooser = ChunkLengthChooser(model, plan, None, AUTO, chunk_length)
    total = 0.0
    for sample in samples:
        count = chooser(*net_input_of(sample))[1] if chooser else int(micro_batches)
        total += predicted_step(model, cfg, k, mode, cost, *net_input_of(sample), chunk_length, placement,
                                micro_batches=count).total
    return total


def shaped_samples(sentences, source_length, target_length, count):
    out = []
    for _ in range(count):
        net_input, target = batch(sentences, [source_length] * sentences, target_length)
        out.append({"net_input": net_input, "target": target})
    return out


def speedups(model, cfg, cost, samples, devices, placement=""):
    """Predicted speed-up over K = 1 for every mode and K (None where the
    plan is impossible: more devices than layers)."""
    base = predicted_seconds(model, cfg, 1, "hybrid", "", cost, samples)
    table = {}
    for mode in MODES:
        for k in devices:
            try:
                seconds = predicted_seconds(model, cfg, k, mode, placement if k > 1 else "", cost, samples)
            except ValueError as error:
                table[f"{mode} K={k}"] = {"speedup": None, "why": str(error)}
                continue
            table[f"{mode} K={k}"] = {"speedup": base / seconds, "seconds_per_step": seconds / len(samples)}
    return table


def gpu_cost(args):
    kinds_phases = [f"{kind}/{phase}" for kind in KINDS for phase in PHASES]
    return gpu_cost_model(
        args.gpu_tflops * 1e12 * args.gpu_efficiency, {key: args.gpu_call_us * 1e-6 for key in kinds_phases},
        args.gpu_step_us, args.gpu_step_overhead_ms * 1e-3, args.link_gbps * 1e9, args.link_latency_us * 1e-6,
        note=(f"assumed GPU: {args.gpu_tflops} TFLOP/s fp32 at {args.gpu_efficiency:.0%} efficiency, "
              f"{args.gpu_call_us} us per cell call, {args.gpu_step_us} us per LSTM time step (forward; twice "
              f"in backward), {args.gpu_step_overhead_ms} ms per step outside the cells; link "
              f"{args.link_gbps} GB/s, {args.link_latency_us} us per transfer"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en), as for bench_suite.py")
    parser.add_argument("--arch", default="hybrid_lstm_base")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=10, help="as bench_suite.py --batches")
    parser.add_argument("--measured", help="bench_suite.py's bench.json to validate against")
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--paper-batch", default="128,50,50", help="sentences,source,target tokens (assumed)")
    parser.add_argument("--paper-vocab", type=int, default=32000, help="assumed vocabulary of the paper's setting")
    parser.add_argument("--gpu-tflops", type=float, default=9.3, help="fp32 peak of the assumed GPU (P100: 9.3)")
    parser.add_argument("--gpu-efficiency", type=float, default=0.5)
    parser.add_argument("--gpu-call-us", type=float, default=30.0, help="fixed cost of a cell call")
    parser.add_argument("--gpu-step-us", type=float, default=20.0, help="latency of one LSTM time step")
    parser.add_argument("--gpu-step-overhead-ms", type=float, default=5.0)
    parser.add_argument("--link-gbps", type=float, default=12.0, help="device-to-device bytes/s / 1e9 (PCIe 3 x16)")
    parser.add_argument("--link-latency-us", type=float, default=10.0)
    parser.add_argument("--bound-only", action="store_true",
                        help="only the dependency bound: no calibration, every FLOP costs the same, nothing else")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)

    task, _, _ = build(args.data, preset_args(args.arch))
    samples = batches(task, args.max_tokens, args.batches + 2)
    timed = samples[2:]
    devices = [int(x) for x in args.devices.split(",")]
    # What the cells' dependencies alone allow: no fixed costs, no overhead,
    # no contention, every floating-point operation equally expensive.
    twin, cfg = twin_model(args.arch, len(task.target_dictionary))
    bound = speedups(twin, cfg, CostModel(), timed, devices)
    print(f"Dependency bound ({args.arch}, Tatoeba batches; every FLOP costs the same, nothing else costs)")
    for name, row in bound.items():
        print(f"  {name}: " + (f"{row['speedup']:.2f}x" if row["speedup"] else "n/a"))
    if args.bound_only:
        write_report({"dependency_bound": bound}, args.json)
        return
    measured = json.load(open(args.measured)) if args.measured else None
    cost, model = calibrate(args.data, samples, args.arch, group_threads=measured["devices"] if measured else 2)
    result = {"cost_model": cost.__dict__, "dependency_bound": bound, "validation": {}, "this_machine": {},
              "paper_setting": {}}

    if measured:
        systems = measured["systems"]
        k = measured["devices"]
        ceiling = next(row["speedup"] for name, row in systems.items() if name.endswith("(ceiling)"))
        cost.slowdown = k / ceiling  # what running K at once costs each of them on this machine
        twin, cfg = twin_model(args.arch, len(task.target_dictionary))
        base = predicted_seconds(twin, cfg, 1, "hybrid", "", cost, timed)
        print(f"Validation on this machine (K = {k} CPU devices, slowdown per device when all run: {cost.slowdown:.3f})")
        print("| system | predicted speed-up | measured speed-up | error |\n| --- | ---: | ---: | ---: |")
        for name, row in systems.items():
            chosen = validation_system(name, row, k)
            if chosen is None:
                continue
            mode, placement, micro_batches = chosen
            if placement == "auto":
                placement = best_placement(twin, cfg, [torch.device("cpu")] * k)[0]
            predicted = base / predicted_seconds(twin, cfg, k, mode, placement, cost, timed,
                                                 micro_batches=micro_batches)
            error = predicted / row["speedup"] - 1
            result["validation"][name] = {"predicted": predicted, "measured": row["speedup"], "error": error}
            print(f"| {name} | {predicted:.2f}x | {row['speedup']:.2f}x | {error:+.0%} |")

    twin, cfg = twin_model(args.arch, len(task.target_dictionary))
    result["this_machine"] = speedups(twin, cfg, cost, timed, devices)
    print(f"\nPredicted on this machine's cost model ({args.arch}, Tatoeba batches; hybrid and model need K <= layers)")
    for name, row in result["this_machine"].items():
        print(f"  {name}: " + (f"{row['speedup']:.2f}x" if row["speedup"] else "n/a"))

    sentences, source, target = (int(x) for x in args.paper_batch.split(","))
    paper, paper_cfg = twin_model("hybrid_lstm_paper", args.paper_vocab)
    gpu = gpu_cost(args)
    paper_samples = shaped_samples(sentences, source, target, 1)
    result["paper_setting"] = {
        "assumptions": gpu.note + f"; batch {sentences} sentences of {source} source and {target} target tokens; "
                       f"vocabulary {args.paper_vocab}; default placement",
        "predicted": speedups(paper, paper_cfg, gpu, paper_samples, [1, 2, 4]),
        "paper": "4.13x to 4.20x (hybrid, 4 GPUs vs 1)",
    }
    print(f"\nPaper setting (hybrid_lstm_paper, 4 GPUs) under assumptions: {result['paper_setting']['assumptions']}")
    for name, row in result["paper_setting"]["predicted"].items():
        print(f"  {name}: " + (f"{row['speedup']:.2f}x" if row["speedup"] else "n/a"))
    print("  the paper: 4.13x to 4.20x (hybrid, 4 GPUs vs 1)")
    write_report(json.loads(json.dumps(result, default=str)), args.json)


if __name__ == "__main__":
    main()
