#!/usr/bin/env python3
"""The settings search behind the Tatoeba recipe's defaults.

Each setting is the recipe (``recipes/tatoeba_ja_en/run.sh``: same split,
test set, beam 5 and sacrebleu scoring) with a fixed number of updates and
some training options changed.  Runs are kept under
``WORK/search/<name>`` and skipped when done (the recipe's own resume
logic), so the search can be stopped, rerun and extended.  Prints, and
writes as JSON and Markdown (``docs/search/tatoeba.*``), every setting's
BLEU, chrF2, validation perplexity and training time.

  python benchmarks/tatoeba_search.py                      # every setting, in order
  python benchmarks/tatoeba_search.py --only poly-lr5e-3   # some of them
  python benchmarks/tatoeba_search.py --report-only        # tables from the runs on disk

Training time is the wall clock of the run's ``fairseq-train``; it is only
comparable between runs made while the machine did nothing else.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "tatoeba_ja_en", "run.sh")

# name -> (updates, fairseq-train options, what it tries).  Every setting
# also keeps the recipe's own options (label smoothing 0.1, Adam, clip 1.0,
# 2,000 tokens per batch, seed 1) unless it overrides them.
UPDATES = 2600


def poly(lr, warmup=500, updates=UPDATES):
    return ["--lr", str(lr), "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(warmup),
            "--total-num-update", str(updates), "--end-learning-rate", "0"]


SETTINGS = {
    "poly-lr5e-3": (UPDATES, poly(0.005), "linear warm-up 500 then linear decay to 0, lr 0.005"),
    "isqrt-lr5e-3": (UPDATES, ["--lr", "0.005", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "500",
                               "--warmup-init-lr", "1e-4"],
                     "inverse square root schedule, lr 0.005, warm-up 500"),
    "poly-lr8e-3": (UPDATES, poly(0.008), "as poly-lr5e-3 with lr 0.008"),
    "poly-lr5e-3-drop0.2": (UPDATES, poly(0.005) + ["--dropout", "0.2"], "as poly-lr5e-3 with dropout 0.2"),
    "poly-lr5e-3-tok3000": (UPDATES, poly(0.005) + ["--max-tokens", "3000"],
                            "as poly-lr5e-3 with 3,000 tokens per batch"),
    "poly-lr8e-3-drop0": (UPDATES, poly(0.008) + ["--dropout", "0.0"], "as poly-lr8e-3 without dropout"),
    "isqrt-lr8e-3-drop0": (UPDATES, ["--lr", "0.008", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "500",
                                     "--warmup-init-lr", "1e-4", "--dropout", "0.0"],
                           "inverse square root schedule, lr 0.008, warm-up 500, no dropout"),
}
# The recipe's defaults (its 4,000 updates) with other seeds: how much the
# seed alone moves BLEU.
for _seed in (2, 3):
    SETTINGS[f"isqrt-lr5e-3-seed{_seed}"] = (4000, SETTINGS["isqrt-lr5e-3"][1] + ["--seed", str(_seed)],
                                              f"the recipe's defaults (4,000 updates) with seed {_seed}")
EVALUATE = os.path.join(REPO, "recipes", "tatoeba_ja_en", "evaluate.sh")
# The checkpoints each run is scored with: the recipe's own (the average of
# the last 5, in the run folder), and these, each in selection/<name>/.
SELECTIONS = ("last", "best")


def run_dir(work, name):
    return os.path.join(work, "search", name)


def run_setting(work, name, log):
    updates, options, _ = SETTINGS[name]
    # Checkpoints every 200 updates, the last 5 kept (as the recipe does).
    # The run folder's own score is the average's (the table's first BLEU column).
    command = ["bash", RECIPE, "--work-dir", work, "--run-name", os.path.join("search", name),
               "--max-update", str(updates), "--select", "average", "--", "--save-interval-updates", "200",
               "--keep-interval-updates", "5", *options]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(command)}", flush=True)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if "| valid |" in line or ("train_inner" in line and re.search(r"num_updates=\d*[05]00,", line)):
                print("    " + line.split("| INFO |")[-1].strip()[:150], flush=True)
        if process.wait() != 0:
            raise SystemExit(f"error: {name} failed (exit {process.returncode}); see {log.name}")


def evaluate_selections(work, name):
    """Score the run's last and best checkpoints too (skipped when done)."""
    run = run_dir(work, name)
    for selection in SELECTIONS:
        subprocess.run(["bash", EVALUATE, "--work-dir", work, "--checkpoint",
                        os.path.join(run, "checkpoints", f"checkpoint_{selection}.pt"),
                        "--out", os.path.join(run, "selection", selection)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bleu_of(path):
    try:
        with open(path) as f:
            return {entry["name"]: entry["score"] for entry in json.load(f)}["BLEU"]
    except (OSError, ValueError, KeyError):
        return None


def result(work, name):
    """BLEU, chrF2, last validation perplexity, updates and training seconds
    of a finished run; None when it has not finished."""
    run = run_dir(work, name)
    try:
        with open(os.path.join(run, "score.json")) as f:
            scores = {entry["name"]: entry for entry in json.load(f)}
        with open(os.path.join(run, "train.log")) as f:
            log = f.read()
    except (OSError, ValueError):
        return None
    valid = re.findall(r"\| valid \|.*?\| ppl ([\d.]+)", log)
    updates = re.findall(r"num_updates[ =](\d+)", log)
    seconds = re.findall(r"done training in ([\d.]+) seconds", log)
    return {
        "name": name,
        "what": SETTINGS[name][2],
        "options": " ".join(SETTINGS[name][1]),
        "bleu": scores["BLEU"]["score"],
        "chrf2": scores["chrF2"]["score"],
        "bleu_signature": scores["BLEU"].get("signature", ""),
        "valid_ppl": float(valid[-1]) if valid else None,
        "updates": int(updates[-1]) if updates else None,
        "train_seconds": float(seconds[-1]) if seconds else None,
        "bleu_by_checkpoint": {selection: bleu_of(os.path.join(run, "selection", selection, "score.json"))
                               for selection in SELECTIONS},
    }


def write_report(work, out):
    rows = [row for row in (result(work, name) for name in SETTINGS) if row]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tatoeba.json"), "w") as f:
        json.dump(rows, f, indent=2)
    lines = ["| setting | what it tries | updates | training s | valid ppl | BLEU, average of last 5 | chrF2 "
             "| BLEU, last | BLEU, best |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        seconds = f"{row['train_seconds']:,.0f}" if row["train_seconds"] else "?"
        others = " | ".join(f"{value:.1f}" if value is not None else "?" for value in row["bleu_by_checkpoint"].values())
        lines.append(f"| {row['name']} | {row['what']} | {row['updates']:,} | {seconds} | {row['valid_ppl']} "
                     f"| {row['bleu']:.1f} | {row['chrf2']:.1f} | {others} |")
    if rows:
        lines.append("")
        lines.append(f"Tatoeba ja-en test split (2,051 sentences), beam 5, sacrebleu `{rows[0]['bleu_signature']}`;"
                     " made by `python benchmarks/tatoeba_search.py`. Training seconds are the wall clock of "
                     "fairseq-train, comparable only between runs made while the machine did nothing else.")
    with open(os.path.join(out, "tatoeba.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default=os.path.join(REPO, "work", "tatoeba_ja_en"))
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "search"))
    parser.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    names = [name for name in args.only.split(",") if name] or list(SETTINGS)
    unknown = [name for name in names if name not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    if not args.report_only:
        os.makedirs(os.path.join(args.work_dir, "search"), exist_ok=True)
        for name in names:
            if not result(args.work_dir, name):
                with open(os.path.join(args.work_dir, "search", f"{name}.log"), "a") as log:
                    run_setting(args.work_dir, name, log)
            evaluate_selections(args.work_dir, name)
    write_report(args.work_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
