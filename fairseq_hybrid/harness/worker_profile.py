"""Where a group's step goes, per worker, in threads and in processes:
timers wrapped around the engine's functions (the build, the cells, the
messages between stages, the trainer's hand-offs; each process writes its
own, and CPU stages are forked, so the wrappers reach them), beside
``cProfile`` of every process: two methods in one run.  Used by
``benchmarks/profile_workers.py`` (docs/bench/profile_workers_*.md)."""

from __future__ import annotations

import cProfile
import functools
import gc
import json
import os
import pstats
import time
from collections import defaultdict

import torch

TIMERS = defaultdict(float)
COUNTS = defaultdict(int)
PROFILERS = {}  # each process's cProfile, by process id
TRACE = []  # a stage's record_cell_times context and its list
PROFILE_FROM = [0]  # the stages' backward pass after which their profile starts
DUMP_AT = [0]  # the stages' backward pass after which they write their profiles (set before they fork)


# what both wires' messages are timed by: (method, label)
WIRE_PARTS = (("_receive", "messages: receive (waits for the peer)"), ("send", "messages: send"),
              ("flush", "messages: flush"))


def timed(owner, name: str, label: str) -> None:
    """Wrap ``owner.name`` so that its calls add to ``TIMERS[label]``."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMERS[label] += time.perf_counter() - start
            COUNTS[label] += 1

    setattr(owner, name, wrapper)


def instrument(folder: str) -> None:
    """Timers on the engine's parts, in this process and in every stage
    forked from it; each stage writes its timers and its profile into
    ``folder`` after every backward pass."""
    from fairseq_hybrid import hybrid_group
    from fairseq_hybrid.parallel import step
    from fairseq_hybrid.parallel.processes import gpu_wire, host_wire, stage, stage_processes
    from fairseq_hybrid.parallel.runtime import cell_graph, cell_times

    timed(hybrid_group, "build_step", "build")  # the threads' build, and what the group hands its stages
    timed(step, "stage_step", "build: staging")
    timed(step, "hybrid_cells", "build: cells")
    timed(step, "data_parallel_cells", "build: cells")
    for wire in (gpu_wire.GpuWire, host_wire.HostWire):
        for function, label in WIRE_PARTS:
            timed(wire, function, label)
    timed(cell_graph.CellGraph, "_forward_cell", "cells: forward (with inputs)")
    timed(cell_graph.CellGraph, "_backward_cell", "cells: backward (with inputs)")
    timed(stage.Stage, "forward", "stage: forward command")
    timed(stage_processes.StageProcesses, "loss_sums", "trainer: forward")
    timed(stage_processes.StageProcesses, "backward", "trainer: backward")
    timed(stage_processes.StageProcesses, "_replies", "trainer: waits for the stages")
    timed(step, "run_step", "trainer: run_step (threads, forward)")
    timed(cell_graph.CellGraph, "backward", "trainer: graph backward (threads)")

    original_forward = stage.Stage.forward

    def forward(self, step):
        reply = original_forward(self, step)
        TIMERS["cells: their own run (busy)"] += reply["busy"]
        return reply

    stage.Stage.forward = forward
    original_backward = stage.Stage.backward

    def backward(self, grads):
        start = time.perf_counter()
        graph = self.graph
        try:
            reply = original_backward(self, grads)
            TIMERS["cells: their own run (busy)"] += reply["busy"]
            return reply
        finally:
            TIMERS["stage: backward command"] += time.perf_counter() - start
            COUNTS["stage: backward command"] += 1
            profiler = PROFILERS.get(os.getpid())
            if profiler is not None and COUNTS["stage: backward command"] == PROFILE_FROM[0]:  # warm-up done
                profiler.disable()
                PROFILERS[os.getpid()] = profiler = cProfile.Profile()
                profiler.enable()
            if profiler is not None and COUNTS["stage: backward command"] == DUMP_AT[0]:  # the last timed step
                profiler.disable()
                profiler.dump_stats(os.path.join(folder, f"stage{self.me}.prof"))
                profiler.enable()
            with open(os.path.join(folder, f"stage{self.me}.json"), "w") as out:
                json.dump({"timers": TIMERS, "counts": COUNTS}, out)
            write_cell_times(folder, self.me, graph, COUNTS["stage: backward command"] > PROFILE_FROM[0])

    stage.Stage.backward = backward
    original_main = stage_processes.stage_main

    def stage_main(*args, **kwargs):
        TIMERS.clear()
        COUNTS.clear()
        TRACE[:] = [cell_times.record_cell_times()]
        TRACE.append(TRACE[0].__enter__())
        PROFILERS[os.getpid()] = profiler = cProfile.Profile()
        profiler.enable()
        return original_main(*args, **kwargs)

    stage_processes.stage_main = stage_main


def write_cell_times(folder: str, me: int, graph, timed: bool) -> None:
    """Add this step's cells (their workers, inputs and orders) and how long
    each of this stage's own calls took to ``stage{me}-cells.jsonl``."""
    if len(TRACE) < 2:
        return
    trace = TRACE[1]
    seconds = {f"{entry.name}|{entry.phase}": entry.end - entry.start for entry in trace}
    trace.clear()
    if not timed or graph is None:
        return
    step = {"seconds": seconds, "orders": graph.orders,
            "cells": [[cell.name, cell.worker, [list(ref) for ref in cell.inputs]] for cell in graph.cells]}
    with open(os.path.join(folder, f"stage{me}-cells.jsonl"), "a") as out:
        out.write(json.dumps(step) + "\n")


def critical_path(cells, orders, seconds) -> float:
    """The step's wall time if nothing but its cells took time: every
    worker runs its cells in its order (forward, then backward in reverse),
    each as soon as its inputs (its readers' gradients) are there."""
    consumers = [[] for _ in cells]
    for index, (_, _, inputs) in enumerate(cells):
        for producer, _ in inputs:
            if index not in consumers[producer]:
                consumers[producer].append(index)

    def makespan(worker_orders, needs, phase):
        finish, free, at = {}, [0.0] * len(worker_orders), [0] * len(worker_orders)
        moved = True
        while moved:
            moved = False
            for worker, order in enumerate(worker_orders):
                while at[worker] < len(order) and all(need in finish for need in needs(order[at[worker]])):
                    index = order[at[worker]]
                    start = max([free[worker]] + [finish[need] for need in needs(index)])
                    finish[index] = free[worker] = start + seconds.get(f"{cells[index][0]}|{phase}", 0.0)
                    at[worker] += 1
                    moved = True
        if len(finish) != len(cells):
            raise ValueError("the orders deadlock")
        return max(finish.values(), default=0.0)

    return (makespan(orders, lambda index: [producer for producer, _ in cells[index][2]], "forward")
            + makespan([order[::-1] for order in orders], lambda index: consumers[index], "backward"))


def cell_bound(folder: str, devices: int) -> dict:
    """From the stages' files: a step's critical path and its busiest
    worker's cells (milliseconds, mean over the timed steps)."""
    steps = []
    for me in range(devices):
        path = os.path.join(folder, f"stage{me}-cells.jsonl")
        if not os.path.exists(path):
            return {}
        with open(path) as lines:
            for index, line in enumerate(lines):
                step = json.loads(line)
                if index == len(steps):
                    steps.append(step)
                else:
                    steps[index]["seconds"].update(step["seconds"])
        os.remove(path)
    paths, busiest = [], []
    for step in steps:
        paths.append(critical_path(step["cells"], step["orders"], step["seconds"]))
        per_worker = [0.0] * devices
        for (name, worker, _) in step["cells"]:
            per_worker[worker] += sum(step["seconds"].get(f"{name}|{phase}", 0.0) for phase in ("forward", "backward"))
        busiest.append(max(per_worker))
    count = max(1, len(steps))
    return {"critical_path_ms": 1000 * sum(paths) / count, "busiest_worker_ms": 1000 * sum(busiest) / count,
            "steps": len(steps)}


def make_batches(count: int, max_tokens: int, seed: int = 1):
    """Made-up sentence pairs of 3-20 tokens in batches of at most
    ``max_tokens`` (source or target, padded), each batch's sentences of
    about one length, as fairseq's length-sorted batches are."""
    from fairseq_hybrid.harness.stand_ins import make_dictionary, make_sample

    src_dict, tgt_dict = make_dictionary(), make_dictionary(37)
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for index in range(count):
        width = int(torch.randint(4, 21, (), generator=generator))
        rows = max(1, max_tokens // (width + 1))
        src = [int(n) for n in torch.randint(max(3, width - 3), width + 1, (rows,), generator=generator)]
        tgt = [int(n) for n in torch.randint(max(3, width - 3), width + 1, (rows,), generator=generator)]
        samples.append(make_sample(src_dict, tgt_dict, src, tgt, seed=seed + index))
    return src_dict, tgt_dict, samples


def corpus(args, count: int):
    """The dictionaries and ``count`` batches: of the binarized corpus
    ``args.data`` as fairseq draws them, or made up."""
    if not getattr(args, "data", None):
        return make_batches(count, args.max_tokens)
    from fairseq_hybrid.harness.measuring import batches, task_of

    task = task_of(args.data)
    return task.source_dictionary, task.target_dictionary, batches(task, args.max_tokens, count)


def run(workers: str, devices: int, args, folder: str):
    """Time ``args.steps`` steps after ``args.warmup``; every process's
    timers and profiles of the timed steps only."""
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.stand_ins import StandInTask, build_model
    from fairseq_hybrid.timing.training_steps import backward_step

    torch.manual_seed(0)
    src_dict, tgt_dict, samples = corpus(args, args.warmup + args.steps)
    options = {"encoder_layers": args.layers, "decoder_layers": args.layers}
    if getattr(args, "dropout", None) is not None:
        options["dropout"] = args.dropout
    if devices > 1:
        options.update(hybrid_devices=",".join(["cpu"] * devices), hybrid_workers=workers,
                       hybrid_placement=args.placement, hybrid_micro_batches=str(args.micro_batches),
                       hybrid_chunk_length=str(args.chunk_length))
    model = build_model(args.arch, src_dict, tgt_dict, **options)
    DUMP_AT[0], PROFILE_FROM[0] = args.warmup + args.steps, args.warmup
    rows = getattr(args, "loss_chunk_rows", None)
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1,
                                            **({} if rows is None else {"output_loss_chunk_rows": rows}))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for sample in samples[:args.warmup]:
        backward_step(model, criterion, sample)
        optimizer.step()
    TIMERS.clear()
    COUNTS.clear()
    profiler = cProfile.Profile()
    tokens = 0
    # the stages' files are rewritten after each backward; the warm-up's share is taken off by reading
    # them once before the timed steps
    before = read_stage_files(folder, devices) if workers == "processes" else {}
    gc.collect()  # the process's first full collection after loading, not in the timed steps (train_steps)
    profiler.enable()
    start = time.perf_counter()
    for sample in samples[args.warmup:]:
        backward_step(model, criterion, sample)
        optimizer.step()
        tokens += sample["ntokens"]
    seconds = time.perf_counter() - start
    profiler.disable()
    profiler.dump_stats(os.path.join(folder, "trainer.prof"))
    stages = read_stage_files(folder, devices) if workers == "processes" else {}
    for me, data in stages.items():
        for kind in ("timers", "counts"):
            for key in data[kind]:
                data[kind][key] -= before.get(me, {kind: {}})[kind].get(key, 0)
    group = getattr(model, "hybrid_group", None)
    if group is not None and group.stages is not None:
        group.stages.close()
    bound = cell_bound(folder, devices) if workers == "processes" else {}
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "trainer": dict(TIMERS), "bound": bound,
            "stages": {me: data["timers"] for me, data in stages.items()},
            "calls": {"trainer": dict(COUNTS), **{f"stage {me}": data["counts"] for me, data in stages.items()}}}


def read_stage_files(folder: str, devices: int):
    found = {}
    for me in range(devices):
        path = os.path.join(folder, f"stage{me}.json")
        if os.path.exists(path):
            with open(path) as handle:
                found[me] = json.load(handle)
    return found


def profile_top(path: str, names) -> dict:
    """The cumulative seconds of the functions named, by ``cProfile``."""
    stats = pstats.Stats(path)
    found = defaultdict(float)
    for (filename, _, function), (_, _, _, cumulative, _) in stats.stats.items():
        for label, file_part, wanted in names:
            if function == wanted and filename.endswith(file_part):
                found[label] += cumulative
    return dict(found)


PROFILE_NAMES = [
    ("build", "parallel/step.py", "build_step"),
    *[(label, f"parallel/processes/{wire}.py", function) for wire in ("gpu_wire", "host_wire") for function, label in WIRE_PARTS],
    ("cells: forward (with inputs)", "parallel/runtime/cell_graph.py", "_forward_cell"),
    ("cells: backward (with inputs)", "parallel/runtime/cell_graph.py", "_backward_cell"),
    ("trainer: waits for the stages", "parallel/processes/stage_processes.py", "_replies"),
]


def build_shares(args, groups=(2, 4), repeats: int = 30) -> list:
    """Each worker's build of its own cells from the step's layout against
    the whole step's build (what threads build once, the layout included),
    for groups of K CPU devices, and the layout's own time (made once, by
    the trainer for stages in processes of their own): milliseconds."""
    import statistics
    import timeit

    from fairseq_hybrid.harness.stand_ins import build_model
    from fairseq_hybrid.parallel import build_step, lay_out_step
    from fairseq_hybrid.parallel.recipe.device_plan import build_plan

    src_dict, tgt_dict, samples = corpus(args, 4)
    model = build_model(args.arch, src_dict, tgt_dict, encoder_layers=args.layers, decoder_layers=args.layers)
    rows = []
    for k in [k for k in groups if k <= args.layers]:  # a group has at most a device per layer
        plan = build_plan(",".join(["cpu"] * k), "", "hybrid", args.layers, args.layers)
        layouts = [lay_out_step(model, plan, sample["net_input"], sample["target"]) for sample in samples]

        def median_ms(builds):
            """Each build's median over the batches of its fastest of
            ``repeats`` rounds, the builds taking turns in every round (this
            machine's speed drifts within seconds)."""
            best = [[float("inf")] * len(samples) for _ in builds]
            for _ in range(repeats):
                for b, build in enumerate(builds):
                    for s, (sample, laid) in enumerate(zip(samples, layouts)):
                        best[b][s] = min(best[b][s], timeit.timeit(lambda: build(sample, laid), number=3) / 3)
            return [1000 * statistics.median(times) for times in best]

        whole, layout, *workers = median_ms(
            [lambda sample, _: build_step(model, plan, sample["net_input"], sample["target"], None),
             lambda sample, _: lay_out_step(model, plan, sample["net_input"], sample["target"])]
            + [lambda _, laid, worker=worker: build_step(model, plan, None, None, None, worker=worker, layout=laid)
               for worker in range(k)])
        rows.append({"k": k, "whole_ms": whole, "layout_ms": layout, "workers_ms": workers,
                     "largest_share": max(workers) / whole, "goal_share": 1 / k + 0.1})
    return rows


def cpu_name() -> str:
    """The CPU as ``lscpu`` names it: model name, family and model."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def render(results, args, builds=()) -> str:
    steps = args.steps
    lines = [f"# Where a group's step goes, per worker ({args.arch}, {args.layers} + {args.layers} layers, "
             f"{args.devices} CPU devices)", "",
             f"`benchmarks/profile_workers.py`, {steps} timed steps after {args.warmup}, batches of at most "
             f"{args.max_tokens} tokens of "
             f"{'the training split of ' + args.data if getattr(args, 'data', None) else '3-20-token pairs'}, Adam; {cpu_name()}, "
             f"{os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}.", "",
             "| workers | target tokens/s | vs one device | vs threads |", "| --- | ---: | ---: | ---: |"]
    base, threads = results["one device"]["tokens_per_s"], results["threads"]["tokens_per_s"]
    for name, result in results.items():
        lines.append(f"| {name} | {result['tokens_per_s']:,.0f} | {result['tokens_per_s'] / base:.2f}x | "
                     f"{result['tokens_per_s'] / threads:.2f}x |")
    if builds:
        lines += ["", "A worker's build of its own cells from the step's layout against the whole step's build "
                  "(threads build it once, its layout included), and the layout alone (made once, by the trainer "
                  "for stages in processes of their own), plain CPU devices, median of repeated builds:", "",
                  "| K | whole step ms | layout ms | each worker's ms | largest share | goal: 1/K + 10% |",
                  "| ---: | ---: | ---: | --- | ---: | ---: |"]
        for row in builds:
            lines.append(f"| {row['k']} | {row['whole_ms']:.2f} | {row['layout_ms']:.2f} | "
                         f"{', '.join(f'{ms:.2f}' for ms in row['workers_ms'])} | {row['largest_share']:.2f} | "
                         f"{row['goal_share']:.2f} |")
    bounds = [(name, result) for name, result in results.items() if result.get("bound")]
    if bounds:
        threads = results["threads"]
        threads_ms = 1000 * threads["seconds"] / steps
        # what a step does outside its cells' passes, the same code whatever the workers: the criterion,
        # fairseq's step, the optimizer
        outside_ms = threads_ms - 1000 * (threads["trainer"].get("trainer: run_step (threads, forward)", 0.0)
                                          + threads["trainer"].get("trainer: graph backward (threads)", 0.0)) / steps
        lines += ["", "The stages' cells alone, from each stage's own cell times (`record_cell_times`): the step's "
                  "critical path through its cells (every message, build and hand-off free), the busiest worker's "
                  "cells, and what a step does outside its passes (the criterion, fairseq's step, the optimizer: "
                  "the threads' step less their passes); the best a step of processes can be is the critical path "
                  "plus that:", "",
                  "| workers | critical path ms | busiest worker ms | outside the passes ms | measured step ms | "
                  "threads' step ms | threads' step / (critical path + outside) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, result in bounds:
            bound = result["bound"]
            best = bound["critical_path_ms"] + outside_ms
            lines.append(f"| {name} | {bound['critical_path_ms']:.1f} | {bound['busiest_worker_ms']:.1f} | "
                         f"{outside_ms:.1f} | {1000 * result['seconds'] / steps:.1f} | {threads_ms:.1f} | "
                         f"{threads_ms / best:.2f}x |")
    lines += ["", ("Milliseconds a step by the wrapped timers; beside them, cProfile's cumulative time of the same "
               "functions (each process's main thread: a worker thread's cells are not in it):"), ""]
    for name in [name for name in results if name != "one device"]:
        result = results[name]
        rows = [("trainer", result["trainer"], result["profiled"].get("trainer", {}))]
        rows += [(f"stage {me}", timers, result["profiled"].get(f"stage{me}", {}))
                 for me, timers in sorted(result["stages"].items())]
        lines += [f"**{name}** (a step: {1000 * result['seconds'] / steps:.1f} ms)", "",
                  "| process | part | calls a step | ms a step | cProfile |", "| --- | --- | ---: | ---: | ---: |"]
        for process, timers, profiled in rows:
            for label in sorted(timers):
                seconds = timers[label]
                if seconds <= 0:
                    continue
                check = profiled.get(label)
                calls = result["calls"].get(process, {}).get(label, 0) / steps
                lines.append(f"| {process} | {label} | {calls:.1f} | {1000 * seconds / steps:.2f} | "
                             f"{'' if check is None else f'{1000 * check / steps:.2f}'} |")
        lines.append("")
    return "\n".join(lines) + "\n"


