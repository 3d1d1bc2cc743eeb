#!/usr/bin/env python3
"""The benchmark suite: every way of training the same model on the same
batches, side by side in one run, as JSON, a Markdown table and a PNG plot;
then the schedule simulator validated against these measurements
(docs/benchmarks.md, "Benchmark suite and schedule simulator").

Systems, ``hybrid_lstm_base`` size on Tatoeba batches with Adam: fairseq's
``lstm`` with 1 and 2 threads; ``hybrid_lstm_base`` on 1 device with 1 and
K threads; on K devices hybrid (default and searched placement, auto
micro-batches), pure model and pure data parallelism; DDP across K gloo
processes (each on every K-th batch, or with ``--global-batch`` on its
share of every batch); K independent copies at once (the machine's
ceiling).  Each (round, system) runs in a fresh process, rounds interleave
the systems, and each reports target tokens/s and its peak memory.

  python benchmarks/bench_suite.py work/tatoeba_ja_en/bin --out results/bench
"""

import argparse
import gc
import json
import math
import os
import resource
import subprocess
import sys
import threading
import time

from fairseq_hybrid.harness.measuring import (NO_DATA, System, batches, build, ending_with_this_process, suite_systems,
                                              train_steps, write_report)
from fairseq_hybrid.timing import ddp_rank
from fairseq_hybrid.timing.training_steps import share_of, spawned


def group_given(given: str):
    """``--group NAME=OPTIONS``'s name and its options."""
    name, _, options = given.partition("=")
    return name.strip(), options.strip()


def all_systems(k: int, groups=()) -> list:
    """The suite's systems and the groups given by ``--group NAME=OPTIONS``
    (a group of K in its own options, e.g. those a plan chose)."""
    return suite_systems(k) + [System(name, "group", threads=k, mode="hybrid", options=tuple(options.split()))
                               for name, options in map(group_given, groups)]


def system_named(name: str, k: int, groups=()) -> System:
    systems = all_systems(k, groups)
    for system in systems:
        if system.name == name:
            return system
    raise SystemExit(f"no benchmark system {name!r}; the systems: {', '.join(s.name for s in systems)}")


# -- one system, in its own process ---------------------------------------------

# what a group logs each step besides its devices' devK_busy (fairseq metrics)
GROUP_METRICS = ("group_fill", "chunk_len", "micro_batches")


HOST_BOUND = "--arch hybrid_lstm_tiny --encoder-layers 4 --decoder-layers 4"


def build_system(data, system: System, k, device, model=""):
    """``model``: fairseq options added to every ``hybrid_lstm`` system's
    (``--model``; fairseq's own lstm keeps its size)."""
    import torch

    devices = ",".join([f"cuda:{i}" for i in range(k)] if device == "cuda" else ["cpu"] * k)
    args = system.model_args(devices) + (model.split() if system.kind != "fairseq_lstm" else [])
    task, model, criterion = build(data, args)
    if device == "cuda" and system.kind != "group":
        model = model.cuda()
    return task, model, criterion, torch.optim.Adam(model.parameters(), lr=1e-3)


def peak_memory(device, k):
    import torch

    if device == "cuda":
        return {f"cuda:{i}": torch.cuda.max_memory_allocated(i) / 2**20 for i in range(torch.cuda.device_count())}
    return {"process (peak RSS)": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def gloo_process(rank, k, data, max_tokens, count, port, global_batch, model_args, results):
    """One of K processes of plain data parallelism: PyTorch's
    DistributedDataParallel over gloo around the model and its criterion,
    on every K-th batch, or with ``global_batch`` on its share of every
    batch's sentences."""
    import torch

    torch.set_num_threads(1)
    ddp_rank.join(rank, k, port)
    task, model, criterion, _ = build_system(data, System("one device", "one_device"), 1, "cpu", model_args)
    loss = ddp_rank.ddp_loss(model, criterion)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    samples = batches(task, max_tokens, count + 2)
    if global_batch:
        pad = task.target_dictionary.pad()
        warm, timed = ([share_of(sample, rank, k, pad) for sample in part] for part in (samples[:1], samples[2:]))
    else:
        # every rank the same number of steps, or DDP's all-reduce waits forever
        warm, timed = samples[rank:rank + 1], samples[2 + rank:2 + k * (count // k):k]
    tokens, seconds = ddp_rank.timed_steps(model, loss, optimizer, warm, timed)
    results.put((rank, tokens, seconds, peak_memory("cpu", 1)))


def run_one(args):
    import logging

    import torch

    logging.disable(logging.WARNING)
    k, device = args.devices, args.device
    system = system_named(args.one, k, args.group)
    if system.kind == "gloo":
        rows = spawned(gloo_process, (k, args.data, args.max_tokens, args.batches, args.port, args.global_batch,
                                      args.model), k)
        tokens = sum(row[1] for row in rows)
        seconds = max(row[2] for row in rows)
        memory = {f"process {row[0]} (peak RSS)": row[3]["process (peak RSS)"] for row in rows}
        return {"tokens": tokens, "seconds": seconds, "memory_mib": memory}

    threads = system.threads
    torch.set_num_threads(threads)
    copies = k if system.kind == "copies" else 1
    systems = [build_system(args.data, system, k, device, args.model) for _ in range(copies)]
    samples = batches(systems[0][0], args.max_tokens, args.batches + 2)
    totals = [0] * copies

    def work(index, timed):
        if copies > 1:  # OpenMP's thread count is each thread's own: a new thread starts with all cores
            torch.set_num_threads(1)
        # (set again here for one copy, it would undo a group's own choice at its first step: the trainer's threads
        # down to the cores its CPU devices leave, hybrid_group.leave_cores_to_devices)
        _, model, criterion, optimizer = systems[index]
        totals[index] = train_steps(model, criterion, optimizer, samples[2:] if timed else samples[:2], device,
                                    collect=False)[0]

    from fairseq.logging import metrics

    for timed in (False, True):
        # a group logs what its devices did each step as fairseq metrics (devK_busy, group_fill, and what
        # auto chose: chunk_len, micro_batches), averaged here over the timed steps as over a log interval
        with metrics.aggregate(new_root=True) as logged:
            gc.collect()  # before the clock (training_steps.train_steps says why)
            start = time.perf_counter()
            if copies == 1:
                work(0, timed)
            else:
                pool = [threading.Thread(target=work, args=(i, timed)) for i in range(copies)]
                for thread in pool:
                    thread.start()
                for thread in pool:
                    thread.join()
            seconds = time.perf_counter() - start
    group = {name: float(value) for name, value in logged.get_smoothed_values().items()
             if name in GROUP_METRICS or (name.startswith("dev") and name.endswith("_busy"))}
    memory = peak_memory(device, k)
    stages = getattr(getattr(systems[0][1], "hybrid_group", None), "stages", None)
    for index, peak in enumerate(stages.peak_mib if stages is not None else ()):  # --hybrid-workers processes
        memory[f"stage {index} (peak {'RSS' if device == 'cpu' else 'allocated'})"] = peak
    return {"tokens": sum(totals), "seconds": seconds, "memory_mib": memory, "group": group}


# -- the suite -------------------------------------------------------------------------


def write_outputs(result, out):
    k = result["devices"]
    rows = result["systems"]
    # a run of some systems (--systems) leaves out the columns whose reference it did not run
    base = rows.get("hybrid_lstm_base, 1 device", next(iter(rows.values())))["target_tokens_per_s"]
    lstm = rows.get("fairseq lstm, 1 thread", {}).get("target_tokens_per_s", float("nan"))
    ceiling = rows.get(f"{k} independent copies (ceiling)", {}).get("target_tokens_per_s", float("nan")) / base
    lines = [
        "| system | target tokens/s | vs hybrid_lstm_base on 1 device | fraction of the ceiling | vs fairseq lstm (1 thread) | peak memory (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, row in rows.items():
        row["speedup"] = row["target_tokens_per_s"] / base
        row["fraction_of_ceiling"] = row["speedup"] / ceiling
        memory = ", ".join(f"{where} {value:,.0f}" for where, value in row["memory_mib"].items())
        fraction = "" if math.isnan(row["fraction_of_ceiling"]) else f"{row['fraction_of_ceiling']:.0%}"
        versus_lstm = "" if math.isnan(lstm) else f"{row['target_tokens_per_s'] / lstm:.2f}x"
        lines.append(f"| {name} | {row['target_tokens_per_s']:,.0f} | {row['speedup']:.2f}x | {fraction} | "
                     f"{versus_lstm} | {memory} |")
    lines.append("")
    ranks = ("the gloo processes each on a share of every batch (one batch a step)" if result.get("global_batch")
             else "the gloo processes each on every K-th batch (K batches a step)")
    model = f" with `{result['model']}`" if result.get("model") else ""
    lines.append(f"{result['device']}, {k} devices{model}, --max-tokens {result['max_tokens']}, {result['rounds']} rounds x "
                 f"{result['batches']} batches per system, every system in a fresh process per round; {ranks}; "
                 f"one intra-op thread per device unless the name says otherwise; measured {result['date']}.")
    for name, options in map(group_given, result.get("groups", ())):
        lines.append(f"{name}: a group of {k} with `{options}`.")
    groups = {name: row["group"] for name, row in rows.items() if row.get("group")}
    if groups:
        lines += ["", "| group | " + " | ".join(f"device {i} busy" for i in range(k)) +
                  " | group fill | micro-batches | chunk length |",
                  "| --- |" + " ---: |" * (k + 3)]
        for name, group in groups.items():
            busy = " | ".join(f"{group[f'dev{i}_busy']:.0%}" if f"dev{i}_busy" in group else "" for i in range(k))
            chosen = " | ".join(f"{group[key]:.2f}" if key in group else "" for key in ("micro_batches", "chunk_len"))
            fill = f"{group['group_fill']:.0%}" if "group_fill" in group else ""
            lines.append(f"| {name} | {busy} | {fill} | {chosen} |")
        lines += ["", "Busy: the share of a step's forward and backward wall time a device spent running its cells "
                  "(the engine's `devK_busy`, mean of the steps); fill: their mean. Micro-batches and chunk "
                  "length: the mean of what `auto` chose per step (0: K chunks a sequence), where it chose."]
    table = "\n".join(lines) + "\n"
    write_report(result, os.path.join(out, "bench.json"), table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    values = [rows[name]["target_tokens_per_s"] for name in names]
    figure, axis = plt.subplots(figsize=(9, 4.5))
    kinds = {system.name: system for system in all_systems(k, result.get("groups", ()))}
    colors = ["#999999" if kinds[n].kind == "fairseq_lstm" else "#4c72b0" if kinds[n].mode == "hybrid"
              else "#dd8452" for n in names]
    axis.barh(range(len(names)), values, color=colors)
    axis.set_yticks(range(len(names)), names)
    axis.invert_yaxis()
    axis.set_xlabel("target tokens/s (training)")
    axis.set_title(f"{result.get('model') or 'hybrid_lstm_base size'}, Tatoeba ja-en, {k} {result['device']} devices",
                   fontsize=9 if result.get("model") else None)
    for index, value in enumerate(values):
        axis.text(value, index, f" {value:,.0f}", va="center", fontsize=8)
    figure.tight_layout()
    figure.savefig(os.path.join(out, "bench.png"), dpi=120)
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--out", default="results/bench", help="folder for bench.json, bench.md, bench.png")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--devices", type=int, default=2, help="K")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=10, help="timed batches per system and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=29655, help="for the gloo processes")
    parser.add_argument("--no-simulation", action="store_true", help="skip the simulator's validation")
    parser.add_argument("--systems", default=None,
                        help="run only these systems (names as in the table, separated by ';'; default all)")
    parser.add_argument("--global-batch", action="store_true",
                        help="the gloo processes split every batch's sentences (one batch a step, as the other "
                        "systems train) instead of each taking every K-th batch")
    parser.add_argument("--model", default="",
                        help="fairseq options added to every hybrid_lstm system's, e.g. a size or depth")
    parser.add_argument("--host-bound", action="store_true",
                        help=f"the regime a GPU's host is in, where a cell's call is mostly host time: --model "
                        f"'{HOST_BOUND}'")
    parser.add_argument("--group", action="append", default=[], metavar="NAME=OPTIONS",
                        help="a further system: a group of K devices with these fairseq options (e.g. "
                        "'planned=--hybrid-chunk-length 13 --hybrid-micro-batches 1'); repeatable")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.host_bound:
        args.model = f"{HOST_BOUND} {args.model}".strip()
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {NO_DATA}")
    if args.devices < 1 or args.batches < args.devices:
        parser.error(f"--batches {args.batches} with --devices {args.devices}: "
                     "every one of the K gloo processes needs at least one timed batch")
    if args.one:
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return 0

    os.makedirs(args.out, exist_ok=True)
    for given in args.group:
        if "=" not in given or not group_given(given)[0]:
            parser.error(f"--group {given!r}: NAME=OPTIONS")
    names = [system.name for system in all_systems(args.devices, args.group)]
    if args.systems:
        asked = [name.strip() for name in args.systems.split(";") if name.strip()]
        for name in asked:
            system_named(name, args.devices, args.group)  # an unknown name: one line naming the systems
        names = [name for name in names if name in asked]
    totals = {name: {"tokens": 0, "seconds": 0.0, "memory_mib": {}, "group": []} for name in names}
    started = time.time()
    for round_index in range(args.rounds):
        for name in names:
            command = [sys.executable, os.path.abspath(__file__), args.data, "--one", name, "--device", args.device,
                       "--devices", str(args.devices), "--max-tokens", str(args.max_tokens),
                       "--batches", str(args.batches), "--port", str(args.port), "--model=" + args.model] + \
                (["--global-batch"] if args.global_batch else []) + [f"--group={given}" for given in args.group]
            done = subprocess.run(command, capture_output=True, text=True, preexec_fn=ending_with_this_process())
            line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
            if done.returncode != 0 or not line:
                sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
                raise SystemExit(f"system {name!r} failed (round {round_index + 1})")
            one = json.loads(line[0][len("RESULT "):])
            total = totals[name]
            total["tokens"] += one["tokens"]
            total["seconds"] += one["seconds"]
            for where, value in one["memory_mib"].items():
                total["memory_mib"][where] = max(value, total["memory_mib"].get(where, 0.0))
            if one.get("group"):
                total["group"].append(one["group"])
            print(f"round {round_index + 1}: {name:48s} {one['tokens'] / one['seconds']:8,.0f} target tokens/s",
                  flush=True)
    result = {"device": args.device, "devices": args.devices, "max_tokens": args.max_tokens,
              "global_batch": args.global_batch, "batches": args.batches, "rounds": args.rounds, "model": args.model,
              "date": time.strftime("%Y-%m-%d"), "minutes": (time.time() - started) / 60, "placement": "auto",
              "groups": args.group, "systems": {}}
    for system in all_systems(args.devices, args.group):
        if system.name not in totals:
            continue
        total = totals[system.name]
        result["systems"][system.name] = {"target_tokens_per_s": total["tokens"] / total["seconds"],
                                          "memory_mib": total["memory_mib"], "kind": system.kind,
                                          "mode": system.mode, "placement": system.placement,
                                          "micro_batches": system.micro_batches, "options": " ".join(system.options)}
        if total["group"]:  # each round's mean over its steps, averaged over the rounds
            result["systems"][system.name]["group"] = {
                name: sum(one[name] for one in total["group"]) / len(total["group"]) for name in total["group"][0]}
    print()
    print(write_outputs(result, args.out))
    # the validation needs every system, at the size the simulator prices
    simulated = not (args.no_simulation or args.systems or args.model) and args.device == "cpu"
    if simulated:
        simulator = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simulate_schedule.py")
        subprocess.run([sys.executable, simulator, args.data, "--max-tokens", str(args.max_tokens),
                        "--batches", str(args.batches), "--measured", os.path.join(args.out, "bench.json"),
                        "--json", os.path.join(args.out, "simulation.json")], check=True,
                       preexec_fn=ending_with_this_process())
    print(f"\nwritten: {args.out}/bench.json, bench.md, bench.png" + (", simulation.json" if simulated else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
