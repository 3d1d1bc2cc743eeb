#!/usr/bin/env python3
"""The schedule simulator checked on this machine: a cost model fitted to one
CPU device running the engine (``fairseq_hybrid.timing.cpu_calibration``),
the speed-ups it predicts for the benchmark suite's groups set beside what
the suite measured (``--measured``; ``bench_suite.py`` runs this after its
own measurements), and its predictions for K = 1, 2, 4, 8.  First, and
alone with ``--bound-only`` (seconds), the dependency bound: every FLOP
costs the same and nothing else costs.  The ``--json`` file's
``cost_model`` is what ``--hybrid-cost-model`` reads (as it reads
``fairseq-hybrid-plan calibrate``'s file).

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
from fairseq_hybrid.forecasts.gpu_costs import predicted_step
from fairseq_hybrid.planning.placement_search import best_placement
from fairseq_hybrid.planning.twin_model import twin_model
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en), as for bench_suite.py")
    parser.add_argument("--arch", default="hybrid_lstm_base")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=10, help="as bench_suite.py --batches")
    parser.add_argument("--measured", help="bench_suite.py's bench.json to validate against")
    parser.add_argument("--devices", default="1,2,4,8")
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
    result = {"cost_model": cost.__dict__, "dependency_bound": bound, "validation": {}, "this_machine": {}}

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

    write_report(json.loads(json.dumps(result, default=str)), args.json)


if __name__ == "__main__":
    main()
