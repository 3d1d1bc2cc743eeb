#!/usr/bin/env python3
"""Does training on a hybrid group reach the BLEU of one device?  Several
seeds per side, because one pair of runs cannot say.

Each run is the Tatoeba recipe (``recipes/tatoeba_ja_en/run.sh``) with
only the seed and the side's options changed: ``one``, the single-device
model (2 intra-op threads); ``group``, the same model on ``--devices``
(one thread each) plus ``--group-args``.  ``--devices cpu`` is a group of
one: only the engine's order of floating-point operations.  Runs are kept
under ``WORK/parity/<side>_seed<N>`` and resumed, so the study can be
stopped and given more seeds.  Reports each run's BLEU, chrF2 and
validation perplexity, the mean and deviation per side and the paired
difference per seed (``docs/parity/GROUP.*``).

  python benchmarks/bleu_parity.py --seeds 1,2,3
  python benchmarks/bleu_parity.py --report-only
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

from fairseq_hybrid.harness.child_groups import group_of_its_own, run_in_group
from fairseq_hybrid.harness.measuring import write_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "tatoeba_ja_en", "run.sh")
SIDES = ("one", "group")


def side_options(side, devices, group_args):
    """(recipe options, fairseq-train options) of a side."""
    if side == "one":
        return [], []
    if side == "group":
        return [], ["--hybrid-devices", devices] + group_args
    raise ValueError(side)


def run_name(side, devices, group_args):
    """Runs of the group side are named after the options that set them apart."""
    if side != "group":
        return side
    slug = "-".join(re.sub(r"[^A-Za-z0-9]+", "-", part).strip("-")
                    for part in ([devices] if devices != "cpu,cpu" else []) + group_args)
    return "group" + (f"-{slug}" if slug else "")


def run_dir(work, side, seed, devices="cpu,cpu", group_args=()):
    return os.path.join(work, "parity", f"{run_name(side, devices, list(group_args))}_seed{seed}")


def run_one(work, side, seed, devices, group_args, log):
    recipe_options, train_options = side_options(side, devices, group_args)
    name = os.path.relpath(run_dir(work, side, seed, devices, group_args), work)
    command = ["bash", RECIPE, "--work-dir", work, "--run-name", name, "--steps", "train,average,generate,score",
               *recipe_options, "--", "--seed", str(seed), *train_options]
    print(f"[{time.strftime('%H:%M:%S')}] {side} seed {seed}: {' '.join(command)}", flush=True)
    start = time.time()
    # the recipe's fairseq-train and translator end with this script, however it ends
    with group_of_its_own(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            log.write(line)
            if "| valid |" in line or "train_inner" in line and re.search(r"num_updates=\d*[05]00,", line):
                print("    " + line.split("| INFO |")[-1].strip()[:150], flush=True)
        if process.wait() != 0:
            raise SystemExit(f"error: {side} seed {seed} failed (exit {process.returncode}); see {log.name}")
    print(f"    done in {time.time() - start:.0f} s", flush=True)


def read_result(path):
    """The run's scores, or None when it has not finished."""
    try:
        scores = json.load(open(os.path.join(path, "score.json")))
        log = open(os.path.join(path, "train.log")).read()
    except FileNotFoundError:
        return None
    valid = re.findall(r"\| valid \|.*?\| ppl ([0-9.]+) \|.*?num_updates (\d+)", log)
    result = {s["name"]: s["score"] for s in scores}
    result["valid_ppl"], result["updates"] = (float(valid[-1][0]), int(valid[-1][1])) if valid else (None, None)
    return result


def mean_std(values):
    if not values:
        return None, None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return mean, std


def summarise(work, seeds, sides, devices, group_args):
    runs = {side: {seed: read_result(run_dir(work, side, seed, devices, group_args)) for seed in seeds}
            for side in sides}
    summary = {}
    for side in sides:
        done = {seed: r for seed, r in runs[side].items() if r}
        summary[side] = {metric: mean_std([r[metric] for r in done.values()])
                         for metric in ("BLEU", "chrF2", "valid_ppl")}
        summary[side]["seeds"] = sorted(done)
    paired = {}
    if "one" in sides:
        for side in sides:
            if side == "one":
                continue
            diffs = [runs[side][s]["BLEU"] - runs["one"][s]["BLEU"] for s in seeds if runs[side][s] and runs["one"][s]]
            mean, std = mean_std(diffs)
            paired[side] = {"BLEU differences": diffs, "mean": mean, "std": std,
                            "standard_error": std / math.sqrt(len(diffs)) if std is not None else None}
    return runs, summary, paired


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(runs, summary, paired, seeds, sides, devices, group_args):
    labels = {"one": "1 device", "group": f"group on {devices}" + (" " + " ".join(group_args) if group_args else "")}
    lines = ["| side | seed | BLEU | chrF2 | valid ppl |", "| --- | --- | --- | --- | --- |"]
    for side in sides:
        for seed in seeds:
            r = runs[side][seed]
            if r:
                lines.append(f"| {labels[side]} | {seed} | {r['BLEU']} | {r['chrF2']} | {fmt(r['valid_ppl'])} |")
        s = summary[side]
        if s["seeds"]:
            lines.append(f"| **{labels[side]}, mean ± sd** | {len(s['seeds'])} seed{'s' if len(s['seeds']) != 1 else ''} | "
                         + " | ".join(f"{fmt(s[m][0], 2)} ± {fmt(s[m][1], 2)}" for m in ("BLEU", "chrF2", "valid_ppl"))
                         + " |")
    for side, p in paired.items():
        if p["BLEU differences"]:
            lines.append("")
            lines.append(f"{labels[side]} minus 1 device, BLEU, same seed: "
                         + ", ".join(f"{d:+.1f}" for d in p["BLEU differences"])
                         + f" (mean {p['mean']:+.2f}"
                         + (f", standard error {p['standard_error']:.2f})" if p["standard_error"] is not None else ")"))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: 1,2,3)")
    parser.add_argument("--sides", default="one,group", help=f"comma-separated subset of {','.join(SIDES)}")
    parser.add_argument("--devices", default="cpu,cpu", help="the group's --hybrid-devices")
    parser.add_argument("--group-args", default="", help="further fairseq-train options of the group side")
    parser.add_argument("--work-dir", default=os.path.join(REPO, "work", "tatoeba_ja_en"))
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "parity"),
                        help="folder for GROUP.json and GROUP.md, GROUP the group's run name (group, group-cpu, ...)")
    parser.add_argument("--report-only", action="store_true", help="train nothing; report the finished runs")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    sides = args.sides.split(",")
    for side in sides:
        if side not in SIDES:
            parser.error(f"unknown side {side!r}; choose from {', '.join(SIDES)}")
    group_args = args.group_args.split()

    if not args.report_only:
        if not os.path.exists(os.path.join(args.work_dir, "bin", ".done")):
            done = run_in_group(["bash", RECIPE, "--work-dir", args.work_dir, "--steps",
                                 "download,prepare,spm,binarize"])
            if done.returncode != 0:
                raise SystemExit(f"error: preparing the data failed (exit {done.returncode})")
        os.makedirs(os.path.join(args.work_dir, "parity"), exist_ok=True)
        with open(os.path.join(args.work_dir, "parity", "study.log"), "a") as log:
            for seed in seeds:  # seed by seed, so that a stopped study still has pairs
                for side in sides:
                    run_one(args.work_dir, side, seed, args.devices, group_args, log)

    runs, summary, paired = summarise(args.work_dir, seeds, sides, args.devices, group_args)
    table = markdown(runs, summary, paired, seeds, sides, args.devices, group_args)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, run_name("group", args.devices, group_args))
    write_report({"seeds": seeds, "devices": args.devices, "group_args": group_args,
                  "runs": {side: {str(k): v for k, v in r.items()} for side, r in runs.items()},
                  "summary": summary, "paired": paired}, stem + ".json", table)
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    sys.exit(main())
