#!/usr/bin/env python3
"""``fairseq-hybrid-plan --measure`` checked on this machine's CPU devices,
in one run: the plan with ``--measure cpu,...``, then the benchmark
suite's systems that match the plan's candidates (one device with K
threads, DDP over gloo with ``--global-batch``, a group in threads and
one in processes, each group in the options the plan chose for it:
chunk length, micro-batches, softmax chunks, placement), at the same
``--max-tokens`` on the same data, each in alternating rounds.  It
answers: is each prediction within 10% of what the plan measured, and does
the plan pick what the suite measures fastest or one within the suite's
noise? (``--out``.json/.md; docs/benchmarks.md, "Measured on your own
devices").

  python benchmarks/plan_measure_check.py work/tatoeba_ja_en/bin --out docs/bench/plan_measure
  python benchmarks/plan_measure_check.py work/tatoeba_ja_en/bin --host-bound --out docs/bench/plan_measure_host_bound
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from fairseq_hybrid.candidates.ways import from_row
from fairseq_hybrid.harness.measuring import NO_DATA, ending_with_this_process, write_report
from fairseq_hybrid.timing.cpu_calibration import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)


HOST_BOUND = ["--arch", "hybrid_lstm_tiny", "--encoder-layers", "4", "--decoder-layers", "4"]  # bench_suite's


def planned_groups(rows):
    """Each group candidate of the plan as a suite system (``bench_suite.py
    --group``): its name, and its options as the plan chose them."""
    return {row["name"]: (f"{row['name']}, as planned", " ".join(from_row(row).group_options()))
            for row in rows if row.get("way") == "group"}


def suite_names(k: int, groups):
    """The plan's candidates' counterparts among the suite's systems."""
    return {"one GPU": f"hybrid_lstm_base, 1 device, {k} threads",
            f"DDP on {k}": f"data parallel across {k} gloo processes",
            **{candidate: name for candidate, (name, _) in groups.items()}}


def run_suite(args, names, groups, out):
    command = [sys.executable, os.path.join(HERE, "bench_suite.py"), args.data, "--devices", str(args.devices),
               "--max-tokens", str(args.max_tokens), "--batches", str(args.suite_batches), "--rounds",
               str(args.rounds), "--systems", ";".join(names), "--no-simulation", "--global-batch", "--out", out,
               "--port", str(args.port)] + (["--host-bound"] if args.host_bound else []) + \
        [f"--group={name}={options}" for name, options in groups.values()]
    rounds = {name: [] for name in names}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, preexec_fn=ending_with_this_process()) as suite:
        for line in suite.stdout:
            print(line, end="", flush=True)
            match = re.match(r"round \d+: (.+?)\s+([\d,]+) target tokens/s", line)
            if match and match.group(1).strip() in rounds:
                rounds[match.group(1).strip()].append(float(match.group(2).replace(",", "")))
    if suite.returncode:
        raise SystemExit(f"bench_suite.py failed (exit status {suite.returncode})")
    return rounds


def run_plan(args, out):
    command = [os.path.join(BIN, "fairseq-hybrid-plan"), "--measure", ",".join(["cpu"] * args.devices),
               "--rounds", str(args.rounds), "--batches", str(args.plan_batches), "--json", out, "--",
               "fairseq-train", args.data, "--arch", "hybrid_lstm_base", "--criterion",
               "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1", "--max-tokens",
               str(args.max_tokens), "--source-lang", "ja", "--target-lang", "en"] + (HOST_BOUND if args.host_bound
                                                                                     else [])
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, preexec_fn=ending_with_this_process())
    print(done.stdout, flush=True)
    if done.returncode:
        raise SystemExit(f"fairseq-hybrid-plan failed (exit status {done.returncode})")
    with open(out) as file:
        return json.load(file), done.stdout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--out", default="results/plan_measure", help="writes OUT.json and OUT.md")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None, help="default 2000, and 1000 with --host-bound")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suite-batches", type=int, default=10, help="bench_suite.py --batches")
    parser.add_argument("--plan-batches", type=int, default=8, help="fairseq-hybrid-plan --batches")
    parser.add_argument("--port", type=int, default=29681, help="the suite's gloo processes")
    parser.add_argument("--host-bound", action="store_true",
                        help="the regime a GPU's host is in, where a cell's call is mostly host time: "
                        + " ".join(HOST_BOUND) + " (bench_suite.py --host-bound)")
    args = parser.parse_args(argv)
    if args.max_tokens is None:  # the host-bound runs in docs/bench take batches of 1000 tokens
        args.max_tokens = 1000 if args.host_bound else 2000
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {NO_DATA}")
    started = time.time()
    plan, printed = run_plan(args, args.out + "_plan.json")
    groups = planned_groups(plan["rows"])
    names = suite_names(args.devices, groups)
    suite_rounds = run_suite(args, list(names.values()), groups, args.out + "_suite")
    suite = {name: {"median": statistics.median(values), "lowest": min(values), "highest": max(values),
                    "rounds": values} for name, values in suite_rounds.items()}
    fastest = max(suite, key=lambda name: suite[name]["median"])
    picked = names[plan["fastest_measured"]]
    # within the suite's noise: the picked system's rounds reach the fastest's slowest round
    within_noise = picked == fastest or suite[picked]["highest"] >= suite[fastest]["lowest"]
    rows = plan["rows"]
    close = [row["name"] for row in rows if abs(row["measured_vs_predicted"] - 1) <= 0.10]
    report = {"date": time.strftime("%Y-%m-%d"), "minutes": (time.time() - started) / 60, "devices": args.devices,
              "max_tokens": args.max_tokens, "rounds": args.rounds, "plan": plan, "suite": suite,
              "suite_fastest": fastest, "plan_picks": picked, "pick_within_suite_noise": within_noise,
              "predictions_within_10_percent": close}
    lines = ["| candidate | predicted tokens/s | measured (median) | lowest-highest | measured / predicted | "
             "suite's system | suite's target tokens/s (median, lowest-highest) |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for row in rows:
        mine = suite[names[row["name"]]]
        lines.append(f"| {row['name']} | {row['predicted_median']:,.0f} | {row['measured_tokens_per_s']:,.0f} | "
                     f"{min(row['measured_rounds']):,.0f}-{max(row['measured_rounds']):,.0f} | "
                     f"{row['measured_vs_predicted']:.2f} | {names[row['name']]} | {mine['median']:,.0f} "
                     f"({mine['lowest']:,.0f}-{mine['highest']:,.0f}) |")
    lines += ["", "Predicted: the median of the rounds' predictions, each round priced with a calibration run just "
              "before it; measured / predicted: the median of the rounds' ratios.",
              "", f"Predictions within 10% of the plan's own measurement: {len(close)} of {len(rows)}. The plan "
              f"measured fastest: {plan['fastest_measured']} (predicted fastest: {plan['fastest']}); the suite "
              f"measured fastest: {fastest}; the plan's pick is "
              + ("the suite's fastest." if picked == fastest else
                 "within the suite's noise." if within_noise else "outside the suite's noise."),
              "", f"{args.devices} CPU devices, "
              f"{' '.join(HOST_BOUND) + ' (host-bound)' if args.host_bound else 'hybrid_lstm_base'}, {cpu_name()}, "
              f"--max-tokens {args.max_tokens}, {args.rounds} "
              f"rounds each (suite: {args.suite_batches} timed batches a run; plan: {args.plan_batches}); the plan "
              "counts padded source + target tokens, the suite target tokens; the suite's gloo processes split every "
              "batch (--global-batch); measured "
              f"{report['date']} in {report['minutes']:.0f} minutes."]
    markdown = "\n".join(lines) + "\n"
    write_report(report, args.out + ".json", markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
