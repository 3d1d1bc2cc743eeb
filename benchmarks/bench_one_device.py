#!/usr/bin/env python3
"""The main job's training speed on one device, this checkout against an
earlier commit, side by side.

Both sides run the same command, ``benchmarks/profile_training.py DATA
--time-only`` of this checkout (fairseq's Trainer on the recipe's batches
with the recipe's settings), the baseline with ``--package`` pointing at
the earlier commit's ``fairseq_hybrid`` (exported with ``git archive`` to a
temporary folder).  Runs alternate, baseline first, so that a machine whose
speed drifts hits both alike; each round gives a ratio, and the median
ratio is the figure.  Prints each run's milliseconds per update and the
ratios, and writes them as JSON.

  python benchmarks/bench_one_device.py work/tatoeba_ja_en/bin --baseline HEAD~1 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from fairseq_hybrid.harness.measuring import export_tree, write_report

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROFILE = os.path.join(HERE, "profile_training.py")


def ms_per_update(data: str, steps: int, warmup: int, threads: int, package: str = None) -> float:
    command = [sys.executable, PROFILE, data, "--time-only", "--steps", str(steps), "--warmup", str(warmup),
               "--threads", str(threads)] + (["--package", package] if package else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")]))}
    output = subprocess.run(command, capture_output=True, text=True, env=env if package else None)
    match = re.search(r"([\d.]+) ms an update \(fairseq_hybrid from (.*)\)", output.stdout)
    if output.returncode != 0 or not match:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{output.stdout[-2000:]}{output.stderr[-2000:]}")
    return float(match.group(1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--baseline", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="timed updates per run")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="the recipe's intra-op threads")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: no such folder (run recipes/tatoeba_ja_en/run.sh --steps "
                     "download,prepare,spm,binarize)")
    head = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
    dirty = bool(subprocess.check_output(["git", "-C", REPO, "status", "--porcelain", "fairseq_hybrid"], text=True))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_one_device_") as folder:
        baseline = export_tree(REPO, args.baseline, folder)
        print(f"baseline {baseline[:10]} ({args.baseline}) against this checkout {head[:10]}"
              f"{' with uncommitted changes' if dirty else ''}; {args.steps} updates after {args.warmup}, "
              f"{args.threads} threads")
        print(f"{'round':>5}{'baseline ms':>13}{'this ms':>10}{'speed-up':>10}")
        for round_index in range(args.rounds):
            old = ms_per_update(args.data, args.steps, args.warmup, args.threads, folder)
            new = ms_per_update(args.data, args.steps, args.warmup, args.threads)
            rows.append({"round": round_index + 1, "baseline_ms": old, "this_ms": new, "speedup": old / new})
            print(f"{round_index + 1:>5}{old:>13.1f}{new:>10.1f}{old / new:>9.3f}x", flush=True)
    median = statistics.median(row["speedup"] for row in rows)
    print(f"median speed-up: {median:.3f}x (updates per second, this checkout over the baseline)")
    write_report({"baseline": baseline, "head": head, "uncommitted_changes": dirty, "steps": args.steps,
                  "warmup": args.warmup, "threads": args.threads, "rounds": rows, "median_speedup": median}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
