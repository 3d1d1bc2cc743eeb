"""What a process per device costs on CPU devices: a group of K CPU
devices with ``--hybrid-workers threads`` and ``processes`` side by side,
in alternating rounds on the same batches, and what the stages' transport
costs on this machine.

For each kind: the step's wall time, each device's busy time (in its
cells) and idle time (the rest of the step); for processes, the messages
and bytes the stages exchanged a step.  Then torch.distributed's gloo
point to point between two processes here, the transport the stages use
on CPU: one-way latency of a message (a header and a tensor) and its
bandwidth.  Their product with the step's messages and bytes is what the
transport alone adds to a step, next to the idle time processes add over
threads.

  python benchmarks/stage_overhead.py work/tatoeba_ja_en/bin --out docs/bench
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import torch

from fairseq_hybrid.harness.measuring import NO_DATA, batches, build, preset_args, write_report
from fairseq_hybrid.timing.cpu_calibration import cpu_name
from fairseq_hybrid.timing.training_steps import backward_step

KINDS = ("threads", "processes")


def timed_steps(model, criterion, optimizer, samples) -> Dict:
    """Train ``samples``; per step: wall ms, each device's busy ms, and
    (processes) messages and bytes between the stages."""
    from fairseq_hybrid import hybrid_group

    walls, busy, sent = [], [], []
    usages = []
    logged = hybrid_group.log_device_usage
    hybrid_group.log_device_usage = usages.append  # each step's DeviceUsage: seconds in cells by device
    try:
        for sample in samples:
            start = time.perf_counter()
            backward_step(model, criterion, sample)
            optimizer.step()
            optimizer.zero_grad()
            walls.append((time.perf_counter() - start) * 1e3)
            busy.append([seconds * 1e3 for seconds in usages[-1].busy])
            stages = model.hybrid_group.stages
            if stages is not None:
                sent.append(list(stages.sent))
    finally:
        hybrid_group.log_device_usage = logged
    return {"step_ms": walls, "busy_ms": busy, "sent": sent}


def transport_cost(sizes=(1, 1 << 18, 1 << 21), repeats: int = 20) -> Dict:
    """gloo point to point between two fresh processes here (the stages'
    transport on CPU): one-way time of a header and a tensor of each size."""
    script = os.path.join(tempfile.mkdtemp(prefix="stage_overhead_"), "p2p.py")
    with open(script, "w") as file:
        file.write(P2P_SCRIPT)
    out = subprocess.run([sys.executable, script, ",".join(map(str, sizes)), str(repeats)], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    one_way = {int(size): float(ms) / 2 for size, ms in (line.split() for line in out.split("\n") if line.strip())}
    small, large = min(one_way), max(one_way)
    return {"one_way_ms_by_floats": one_way, "latency_ms": one_way[small],
            "mb_per_s": (large - small) * 4 / 1e6 / ((one_way[large] - one_way[small]) / 1e3)}


P2P_SCRIPT = '''
import sys, tempfile, time, torch, torch.distributed as dist, multiprocessing as mp
from fairseq_hybrid.parallel.p2p import Transport

def run(rank, path, sizes, repeats, results):
    torch.set_num_threads(1)
    transport = Transport(rank, 2, dist.FileStore(path, 2), torch.device("cpu"), 60)
    for size in sizes:
        x = torch.randn(size)
        for rep in range(2):  # the first warms up
            start = time.perf_counter()
            for i in range(repeats):
                key = (size, rep, i)
                if rank == 0:
                    transport.expect(1, [key]); transport.send(1, x); transport.flush(); transport.take(1, key)
                else:
                    transport.expect(0, [key]); y, _ = transport.take(0, key); transport.send(0, y); transport.flush()
            if rank == 0 and rep:
                results.put((size, (time.perf_counter() - start) / repeats * 1e3))
    transport.close()

if __name__ == "__main__":
    sizes, repeats = [int(v) for v in sys.argv[1].split(",")], int(sys.argv[2])
    context = mp.get_context("fork")
    results = context.SimpleQueue()
    path = tempfile.mktemp()
    processes = [context.Process(target=run, args=(rank, path, sizes, repeats, results)) for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    while not results.empty():
        size, ms = results.get()
        print(size, ms)
'''


def summary(runs: List[Dict]) -> Dict:
    """Medians over the rounds' steps."""
    steps = [ms for run in runs for ms in run["step_ms"]]
    busy = [row for run in runs for row in run["busy_ms"]]
    row = {"step_ms": statistics.median(steps),
           "busy_ms": [statistics.median(values) for values in zip(*busy)]}
    row["idle_ms"] = [row["step_ms"] - ms for ms in row["busy_ms"]]
    sent = [entry for run in runs for entry in run["sent"]]
    if sent:
        row["messages_per_step"] = statistics.median(entry[0] for entry in sent)
        row["mib_per_step"] = statistics.median(entry[1] for entry in sent) / 2 ** 20
    return row


def markdown(report: Dict) -> str:
    rows = report["kinds"]
    threads, processes = rows["threads"], rows["processes"]
    transport = report["transport"]
    lines = ["# A process per device on CPU devices: what it costs", "",
             f"`benchmarks/stage_overhead.py` on {report['machine']}: a group of {report['devices']} CPU devices "
             f"({report['model']}, {report['batches']} Tatoeba batches at --max-tokens {report['max_tokens']}), "
             f"threads and processes in {report['rounds']} alternating rounds; medians of the steps (the optimizer's "
             "step included).", "",
             "| workers | step ms | busy ms by device | idle ms by device | messages a step | MiB a step |",
             "| --- | ---: | --- | --- | ---: | ---: |"]
    for kind, row in rows.items():
        lines.append(f"| {kind} | {row['step_ms']:.0f} | {', '.join(f'{v:.0f}' for v in row['busy_ms'])} | "
                     f"{', '.join(f'{v:.0f}' for v in row['idle_ms'])} | {row.get('messages_per_step', 0):.0f} | "
                     f"{row.get('mib_per_step', 0):.1f} |")
    estimate = (processes.get("messages_per_step", 0) * transport["latency_ms"]
                + processes.get("mib_per_step", 0) * 2 ** 20 / 1e6 / transport["mb_per_s"] * 1e3)
    lines += ["", f"Processes over threads: {threads['step_ms'] / processes['step_ms']:.2f}x the speed; the busiest "
              f"device idles {max(processes['idle_ms']) - max(threads['idle_ms']):.0f} ms more a step.", "",
              f"gloo point to point here: {transport['latency_ms']:.2f} ms one way for a message (header and "
              f"tensor), {transport['mb_per_s']:,.0f} MB/s; for the step's messages and bytes "
              f"{estimate:.0f} ms of transport alone, summed over the stages (a stage that waits for an input "
              "waits for its message too: the part on the step's critical path is in the idle time above).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=8, help="timed batches a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="folder for stage_overhead.json and .md")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {NO_DATA}")
    torch.set_num_threads(args.devices)
    devices = ",".join(["cpu"] * args.devices)
    systems = {}
    for kind in KINDS:
        task, model, criterion = build(args.data, preset_args("hybrid_lstm_base", devices, workers=kind))
        systems[kind] = (model, criterion, torch.optim.Adam(model.parameters(), lr=1e-3))
    samples = batches(task, args.max_tokens, args.batches + 2)
    runs: Dict[str, List[Dict]] = {kind: [] for kind in KINDS}
    for kind in KINDS:  # warm-up: the stages' start, the first steps
        timed_steps(*systems[kind], samples[:2])
    for round_index in range(args.rounds):
        for kind in KINDS:
            runs[kind].append(timed_steps(*systems[kind], samples[2:]))
            print(f"round {round_index + 1}: {kind} {statistics.median(runs[kind][-1]['step_ms']):.0f} ms a step",
                  flush=True)
    systems["processes"][0].hybrid_group.stages.close()
    machine = f"{cpu_name()}, {multiprocessing.cpu_count()} cores"
    report = {"machine": machine, "devices": args.devices, "model": "hybrid_lstm_base", "max_tokens": args.max_tokens,
              "batches": args.batches, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d"),
              "kinds": {kind: summary(runs[kind]) for kind in KINDS}, "transport": transport_cost(), "runs": runs}
    text = markdown(report)
    print(text)
    if args.out:
        write_report(report, os.path.join(args.out, "stage_overhead.json"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
