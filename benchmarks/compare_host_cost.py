#!/usr/bin/env python3
"""Host time per cell, two versions of the engine side by side.

Runs ``benchmarks/bench_host_cost.py`` of two checkouts (``--old``, an
earlier commit, exported with ``git archive`` to a temporary folder, or a
directory holding one, and this one), each in a fresh process that
imports that checkout's package (its directory first on ``PYTHONPATH``),
one after the other in alternating rounds (old, new, old, new, ...), so
that a shared machine's drift falls on both alike.  For each K it prints
and writes (``--json``) the medians over the rounds of each cell kind's
host time per call, forward and backward, and their ratio new / old:

* ``attention_softmax``: forward + backward;
* ``lstm``: forward + backward, each without the share of the LSTM
  kernel op (``mkldnn_rnn_layer`` on a CPU, which does the layer's work
  itself; on a GPU the same call queues a cuDNN kernel), the share each
  version's own run measures;
* aten ops per cell (forward and backward calls together, one step, K = 1)
  beside them.

With ``--suite DATA`` (a binarized ja-en corpus) it then runs the
benchmark suite's group against one device with K threads, both
``hybrid_lstm_base`` on real batches (``benchmarks/bench_suite.py --one``,
K = ``--suite-devices``), of each checkout, alternating the same way: what
the host saving gives a group of CPU devices, where the host also does the
arithmetic.

    .venv/bin/python benchmarks/compare_host_cost.py --old /tmp/old --groups 1,4 --rounds 5 \
        --suite work/tatoeba_ja_en/bin --json docs/bench/host_cost_compare.json

A time: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence

from fairseq_hybrid.harness.measuring import export_tree

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("attention_softmax", "lstm")


def run_once(tree: str, k: int, steps: int, chunk_length: int = 0, extra: Sequence[str] = (),
             script_tree: str = "") -> Dict:
    """One run of bench_host_cost.py (``script_tree``'s, default
    ``tree``'s) on ``tree``'s package at K workers and ``chunk_length``
    (0: K chunks), with ``extra`` arguments."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "host_cost.json")
        env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
        script = os.path.join(script_tree or tree, "benchmarks", "bench_host_cost.py")
        subprocess.run([sys.executable, script, "--groups", str(k),
                        "--chunk-lengths", str(chunk_length), "--steps", str(steps), "--json", out, *extra],
                       env=env, check=True, stdout=subprocess.DEVNULL, cwd=tree)
        with open(out) as f:
            return json.load(f)


def suite_once(tree: str, data: str, system: str, k: int, batches: int) -> float:
    """Target tokens/s of one benchmark-suite system of ``tree``, in a
    fresh process."""
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, os.path.join(tree, "benchmarks", "bench_suite.py"), os.path.abspath(data),
                           "--one", system, "--devices", str(k), "--batches", str(batches)],
                          env=env, cwd=tree, capture_output=True, text=True)
    line = [text for text in done.stdout.splitlines() if text.startswith("RESULT ")]
    if done.returncode != 0 or not line:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"{tree}: {system!r} failed")
    result = json.loads(line[0][len("RESULT "):])
    return result["tokens"] / result["seconds"]


def suite_rows(trees: Dict[str, str], data: str, k: int, rounds: int, batches: int, started: float) -> Dict:
    systems = {"one device": f"hybrid_lstm_base, 1 device, {k} threads", "group": f"hybrid on {k} devices"}
    measured: Dict[str, Dict[str, List[float]]] = {name: {role: [] for role in systems} for name in trees}
    for round_ in range(rounds):
        for name in ("old", "new"):
            for role, system in systems.items():
                measured[name][role].append(suite_once(trees[name], data, system, k, batches))
        print(f"suite round {round_ + 1}/{rounds} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
              flush=True)
    row: Dict = {"systems": systems, "devices": k, "batches": batches}
    for name in trees:
        medians = {role: statistics.median(values) for role, values in measured[name].items()}
        row[name] = {"tokens_per_s": medians, "runs": measured[name],
                     "group_vs_one_device": medians["group"] / medians["one device"]}
    print(f"suite, K={k}: group against one device with {k} threads {row['old']['group_vs_one_device']:.2f} -> "
          f"{row['new']['group_vs_one_device']:.2f} (group {row['old']['tokens_per_s']['group']:,.0f} -> "
          f"{row['new']['tokens_per_s']['group']:,.0f} target tokens/s)", flush=True)
    return row


def median_report(runs: Dict[int, List[Dict]]) -> Dict:
    """One ``bench_host_cost.py`` report of a checkout from its runs (by
    K): each K's row and the shares per op the medians over the rounds,
    for the simulator (``fair_race.py --host-cost``) to read both versions
    as measured side by side."""
    first = runs[min(runs)][0]
    report = {key: value for key, value in first.items() if key not in ("rows", "op_us", "lstm_kernel_share_k1_whole")}
    every = [report_ for reports in runs.values() for report_ in reports]
    report["op_us"] = statistics.median(r["op_us"] for r in every)
    report["lstm_kernel_share_k1_whole"] = {phase: statistics.median(r["lstm_kernel_share_k1_whole"][phase]
                                                                     for r in every)
                                            for phase in first["lstm_kernel_share_k1_whole"]}
    report["rows"] = []
    for k, reports in sorted(runs.items()):
        rows = [r["rows"][0] for r in reports]
        report["rows"].append({
            "k": k, "chunk_length": 0, "cells_per_step": rows[0]["cells_per_step"],
            "step_ms": statistics.median(row["step_ms"] for row in rows),
            "cell_us": {key: statistics.median(row["cell_us"][key] for row in rows) for key in rows[0]["cell_us"]},
            "outside_cells_us_per_cell": statistics.median(row["outside_cells_us_per_cell"] for row in rows)})
    report["medians_of"] = f"{len(every)} runs of benchmarks/bench_host_cost.py, alternating with the other checkout"
    return report


def host_us(report: Dict) -> Dict[str, float]:
    """Each kind's forward + backward host time per cell call pair, the
    LSTM's without its kernel op's share."""
    row = report["rows"][0]["cell_us"]
    share = report["lstm_kernel_share_k1_whole"]
    out = {}
    for kind in KINDS:
        total = 0.0
        for phase in ("forward", "backward"):
            value = row.get(f"{kind}/{phase}", 0.0)
            if kind == "lstm":
                value *= 1.0 - share[f"lstm/{phase}"]
            total += value
        out[kind] = total
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the earlier version: a git revision, or a checkout of one")
    parser.add_argument("--new", default=HERE, help="the checkout to compare (default: this one)")
    parser.add_argument("--groups", default="1,4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--suite", metavar="DATA", help="also the benchmark suite's group against one device on "
                        "this binarized ja-en corpus")
    parser.add_argument("--suite-devices", type=int, default=2)
    parser.add_argument("--suite-rounds", type=int, default=3)
    parser.add_argument("--suite-batches", type=int, default=10)
    parser.add_argument("--chunk-length", type=int, default=0, help="the groups' chunk length (0: K chunks)")
    parser.add_argument("--new-args", default="", help="more arguments of bench_host_cost.py for the new "
                        "checkout alone (its new options, e.g. '--softmax-chunks 0')")
    parser.add_argument("--one-script", action="store_true", help="time both checkouts with the new checkout's "
                        "bench_host_cost.py (one instrument; its profiler's count too)")
    parser.add_argument("--json")
    parser.add_argument("--reports", metavar="DIR", help="also write each checkout's medians as a bench_host_cost "
                        "report, DIR/host_cost_old.json and DIR/host_cost_new.json (for fair_race.py --host-cost)")
    args = parser.parse_args(argv)
    if args.suite and not os.path.isfile(os.path.join(args.suite, "dict.ja.txt")):
        parser.error(f"--suite {args.suite}: not a binarized ja-en corpus (no dict.ja.txt)")
    with tempfile.TemporaryDirectory(prefix="compare_host_cost_") as folder:
        old = args.old
        if not os.path.isdir(old):
            if subprocess.run(["git", "-C", HERE, "rev-parse", "--verify", "--quiet", old + "^{commit}"],
                              capture_output=True).returncode != 0:
                parser.error(f"--old {old}: neither a directory nor a git revision")
            export_tree(HERE, old, folder, ("fairseq_hybrid", "benchmarks"))
            old = folder
        for tree in (old, args.new):
            if not os.path.isfile(os.path.join(tree, "benchmarks", "bench_host_cost.py")):
                parser.error(f"{tree}: no benchmarks/bench_host_cost.py there")
        compare(args, {"old": os.path.abspath(old), "new": os.path.abspath(args.new)}, args.old)
    return 0


def compare(args, trees: Dict[str, str], old_name: str) -> None:
    results = {"old": old_name, "trees": trees, "rounds": args.rounds, "steps": args.steps, "cores": os.cpu_count(),
               "chunk_length": args.chunk_length, "new_args": args.new_args, "one_script": args.one_script,
               "groups": {}}
    extra = {"old": [], "new": args.new_args.split()}
    script = trees["new"] if args.one_script else ""
    started = time.perf_counter()
    every_run: Dict[str, Dict[int, List[Dict]]] = {"old": {}, "new": {}}
    for k in (int(x) for x in args.groups.split(",")):
        runs: Dict[str, List[Dict]] = {"old": [], "new": []}
        for round_ in range(args.rounds):
            for name in ("old", "new"):
                runs[name].append(run_once(trees[name], k, args.steps, args.chunk_length, extra[name], script))
            print(f"K={k} round {round_ + 1}/{args.rounds} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
                  flush=True)
        row = {}
        for name in ("old", "new"):
            every_run[name][k] = runs[name]
            per_run = [host_us(report) for report in runs[name]]
            row[name] = {
                "host_us": {kind: statistics.median(r[kind] for r in per_run) for kind in KINDS},
                "step_ms": statistics.median(report["rows"][0]["step_ms"] for report in runs[name]),
                "outside_cells_us_per_cell": statistics.median(report["rows"][0]["outside_cells_us_per_cell"]
                                                               for report in runs[name]),
                "ops_per_cell": runs[name][0]["ops_per_cell_k1_whole"],
                "lstm_kernel_share": runs[name][0]["lstm_kernel_share_k1_whole"],
                "cell_us": {key: statistics.median(report["rows"][0]["cell_us"][key] for report in runs[name])
                            for key in runs[name][0]["rows"][0]["cell_us"]},
                "cells_per_step": runs[name][0]["rows"][0]["cells_per_step"],
            }
            if "profiled" in runs[name][0]["rows"][0]:  # the profiler's own account (the script measures it)
                row[name]["profiled"] = {key: statistics.median(report["rows"][0]["profiled"][key]
                                                                for report in runs[name])
                                         for key in runs[name][0]["rows"][0]["profiled"]}
        row["ratio"] = {kind: row["new"]["host_us"][kind] / row["old"]["host_us"][kind] for kind in KINDS}
        row["ratio"]["step"] = row["new"]["step_ms"] / row["old"]["step_ms"]
        if "profiled" in row["old"] and "profiled" in row["new"]:
            row["ratio"]["profiled_op_self"] = (row["new"]["profiled"]["op_self_ms"]
                                                / row["old"]["profiled"]["op_self_ms"])
        results["groups"][str(k)] = row
        print(f"K={k}: " + ", ".join(
            f"{kind} {row['old']['host_us'][kind]:.0f} -> {row['new']['host_us'][kind]:.0f} us "
            f"({row['ratio'][kind]:.2f}x; ops {row['old']['ops_per_cell'].get(kind, 0):.0f} -> "
            f"{row['new']['ops_per_cell'].get(kind, 0):.0f})" for kind in KINDS)
            + f", step {row['old']['step_ms']:.1f} -> {row['new']['step_ms']:.1f} ms ({row['ratio']['step']:.2f}x; "
            f"cells {row['old']['cells_per_step']:.0f} -> {row['new']['cells_per_step']:.0f})"
            + (f", profiler: host in aten ops {row['old']['profiled']['op_self_ms']:.1f} -> "
               f"{row['new']['profiled']['op_self_ms']:.1f} ms a step ({row['ratio']['profiled_op_self']:.2f}x; ops "
               f"{row['old']['profiled']['ops']:.0f} -> {row['new']['profiled']['ops']:.0f})"
               if "profiled_op_self" in row["ratio"] else ""), flush=True)
    if args.reports:
        os.makedirs(args.reports, exist_ok=True)
        for name in ("old", "new"):
            with open(os.path.join(args.reports, f"host_cost_{name}.json"), "w") as f:
                json.dump(median_report(every_run[name]), f, indent=2)
    if args.suite:
        results["suite"] = suite_rows(trees, args.suite, args.suite_devices, args.suite_rounds, args.suite_batches,
                                      started)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
