#!/usr/bin/env python3
"""Time to the main job's quality on 4 GPUs, predicted: convergence measured
on CPU (the same arithmetic as on a GPU), speed from the race.

MLPerf times training to a quality, not tokens/s: a larger global batch
trains faster per sentence on more GPUs but may need more sentences to
reach the same loss.  Two runs of the main job measure that side
(``recipes/tatoeba_ja_en/run.sh``, same seed and data):

* ``x1``: the main job as it is (``--max-tokens 2000``, learning rate 0.005
  after 500 warm-up updates, inverse square root decay);
* ``x4``: 4 times the global batch (``--update-freq 4``), learning rate
  scaled by the square root of the batch (0.01), warm-up over the same
  sentences (125 updates), a validation every 50 updates (the x1 run's 200
  in sentences).  Under the inverse square root schedule its learning rate
  is then twice the x1 run's at every count of sentences seen.

The target is the x1 run's lowest validation loss.  Sentences to reach it
are read off each run's validations (linear between two validations);
each way of training on ``--gpus`` GPUs then takes those sentences at its
predicted sentences per second (``fairseq-hybrid-plan``'s race on the
data's batch shape, ``--cost-set`` or ``--cost-file``): DDP at 4 times the
batch (one main-job batch per GPU), and at the main job's batch DDP, one
group and groups under DDP.  BLEU of each run's best checkpoint on the
test split beside it (``score.json``).

  bash recipes/tatoeba_ja_en/run.sh --run-name time_to_bleu_x1 --steps train,generate,score
  bash recipes/tatoeba_ja_en/run.sh --run-name time_to_bleu_x4 --max-update 1000 \\
      --steps train,generate,score -- --update-freq 4 --lr 0.01 --warmup-updates 125 --save-interval-updates 50
  python benchmarks/time_to_bleu.py work/tatoeba_ja_en/time_to_bleu_x1 work/tatoeba_ja_en/time_to_bleu_x4 \\
      --data work/tatoeba_ja_en/bin --out docs/bench
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, Optional, Sequence

from fairseq_hybrid import train_command
from fairseq_hybrid.commands import plan
from fairseq_hybrid.forecasts import workload
from fairseq_hybrid.harness.measuring import write_report
from fairseq_hybrid.training_log import fields, read_curve

MAIN_JOB = ["--arch", "hybrid_lstm_base", "--max-tokens", "2000", "--source-lang", "ja", "--target-lang", "en"]


def sentences_per_update(run: str) -> float:
    """Mean sentences an update trains (fairseq's ``bsz``, summed over
    ``--update-freq``), over the run's training lines."""
    sizes = []
    with open(os.path.join(run, "train.log"), encoding="utf-8", errors="replace") as log:
        for line in log:
            if "| train_inner |" in line:
                size = fields(line.split("| train_inner |", 1)[1]).get("bsz")
                if size:
                    sizes.append(size)
    if not sizes:
        raise ValueError(f"{run}/train.log: no training lines with bsz")
    return sum(sizes) / len(sizes)


def sentences_to_reach(losses: Dict[int, float], per_update: float, target: float) -> Optional[float]:
    """Sentences seen when the validation loss first reaches ``target``,
    linear between the validation before and the one that reaches it
    (None if none does)."""
    previous = None
    for update in sorted(losses):
        loss = losses[update]
        if loss <= target:
            if previous is None or previous[1] == loss:
                return update * per_update
            before, before_loss = previous
            share = (before_loss - target) / (before_loss - loss)
            return (before + share * (update - before)) * per_update
        previous = (update, loss)
    return None


def bleu_of(run: str) -> Optional[float]:
    """sacrebleu's BLEU of the run's best checkpoint on the test split."""
    path = os.path.join(run, "score.json")
    if not os.path.exists(path):
        return None
    with open(path) as file:
        scores = json.load(file)
    for score in scores if isinstance(scores, list) else [scores]:
        if score.get("name") == "BLEU":
            return float(score["score"])
    return None


def rates(data: str, update_freq: int, gpus: int, costs: Sequence[str]) -> Dict[str, float]:
    """Predicted sentences per second of each way of training the main
    job's batch times ``update_freq`` on ``gpus`` GPUs (the plan's race)."""
    own = plan.build_parser().parse_args(["--gpus", str(gpus), *costs])
    plan.check_own(own)
    args = train_command.parse_training([data, *MAIN_JOB, "--update-freq", str(update_freq)])
    own.group_sizes = plan.group_sizes(args, gpus)
    result = plan.plan(own, args, progress=lambda text: print(text, file=sys.stderr, flush=True))
    return {row["name"]: result["sentences"] / (row["step_ms"] / 1e3) for row in result["rows"]}


def table(x1: str, x4: str, data: str, gpus: int, costs: Sequence[str]) -> Dict:
    runs = {"x1": read_curve(x1), "x4": read_curve(x4)}
    per_update = {"x1": sentences_per_update(x1), "x4": sentences_per_update(x4)}
    target = min(runs["x1"].loss.values())
    needed = {name: sentences_to_reach(curve.loss, per_update[name], target) for name, curve in runs.items()}
    one, four = rates(data, 1, gpus, costs), rates(data, 4, gpus, costs)
    ddp = f"DDP on {gpus}"
    rows = [{"system": f"{ddp}, 4 x the main job's batch (one main-job batch a GPU)", "run": "x4",
             "sentences_per_s": four[ddp]}]
    rows += [{"system": f"{name}, the main job's batch", "run": "x1", "sentences_per_s": rate}
             for name, rate in one.items() if name != "one GPU"]
    for row in rows:
        sentences = needed[row["run"]]
        row["sentences_to_target"] = sentences
        row["minutes"] = None if sentences is None else sentences / row["sentences_per_s"] / 60
    return {"target_validation_loss": target, "sentences_per_update": per_update, "sentences_to_target": needed,
            "bleu": {name: bleu_of(run) for name, run in (("x1", x1), ("x4", x4))},
            "validations": {name: {str(k): v for k, v in curve.loss.items()} for name, curve in runs.items()},
            "gpus": gpus, "costs": list(costs), "rows": rows}


def markdown(report: Dict) -> str:
    bleu = report["bleu"]
    needed = report["sentences_to_target"]

    def amount(value):
        return "not reached" if value is None else f"{value:,.0f}"

    lines = [f"Target: the main job's lowest validation loss, {report['target_validation_loss']:.3f}. Sentences "
             f"to reach it: {amount(needed['x1'])} at the main job's batch "
             f"({report['sentences_per_update']['x1']:.0f} sentences an update), {amount(needed['x4'])} at 4 times "
             f"it ({report['sentences_per_update']['x4']:.0f}); test BLEU of the best checkpoint "
             f"{bleu['x1'] if bleu['x1'] is not None else '-'} and {bleu['x4'] if bleu['x4'] is not None else '-'}. "
             f"Time to it on {report['gpus']} GPUs ({' '.join(report['costs']) or 'a100 set'}; predicted speed, "
             "measured convergence):", "",
             "| way of training | sentences/s (predicted) | minutes to the target (predicted) |",
             "| --- | ---: | ---: |"]
    for row in report["rows"]:
        minutes = "never" if row["minutes"] is None else f"{row['minutes']:.1f}"
        lines.append(f"| {row['system']} | {row['sentences_per_s']:,.0f} | {minutes} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("x1", help="run folder of the main job at its batch (its train.log, score.json)")
    parser.add_argument("x4", help="run folder of the main job at 4 times the batch")
    parser.add_argument("--data", required=True, help="the binarized data the runs trained on (batch shapes)")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--cost-set", default="a100")
    parser.add_argument("--cost-file", default=None)
    parser.add_argument("--out", help="folder for time_to_bleu.json and .md")
    args = parser.parse_args(argv)
    for run in (args.x1, args.x4):
        if not os.path.exists(os.path.join(run, "train.log")):
            parser.error(f"{run}: no train.log (run recipes/tatoeba_ja_en/run.sh first, see --help)")
    costs = ["--cost-file", args.cost_file] if args.cost_file else ["--cost-set", args.cost_set]
    try:
        report = table(args.x1, args.x4, args.data, args.gpus, costs)
    except workload.PlanError as error:
        parser.error(str(error))
    text = markdown(report)
    print(text)
    if args.out:
        write_report(report, os.path.join(args.out, "time_to_bleu.json"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
