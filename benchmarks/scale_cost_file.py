#!/usr/bin/env python3
"""A GPU cost file with its host time per cell call scaled by what a change
of the engine did to it on this machine: until a GPU measures the changed
calls itself, the nearest honest price of them there.

``compare_host_cost.py --json`` measures, old checkout against new in one
run, each cell kind's host time per call (the LSTM's without its CPU
kernel op); this takes the ratio new / old of each kind at ``--k`` workers
and multiplies the cost file's host time per call of that kind by it (every
row, forward and backward alike; the other kinds, and the time outside
the cells, as measured), and says so in the file's ``what``.  Every figure
priced from the result is a prediction twice over: a CPU's ratio applied
to a GPU host's times.

  python benchmarks/scale_cost_file.py docs/bench/cost_file_h200.json \\
      docs/bench/host_cost_compare_calls.json docs/bench/cost_file_h200_joined_softmax.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Dict

from fairseq_hybrid.forecasts import cost_file

KINDS = ("attention_softmax", "lstm")


def scaled(data: Dict, compare: Dict, k: int, source: str, comparison: str) -> Dict:
    """``data`` (a cost file) with each of :data:`KINDS`' host time per call
    times ``compare``'s new / old ratio at ``k`` workers."""
    ratios = {kind: compare["groups"][str(k)]["ratio"][kind] for kind in KINDS}
    out = copy.deepcopy(data)
    for row in out["host_cost"]["rows"]:
        for key in row["cell_us"]:
            kind = key.split("/")[0]
            if kind in ratios:
                row["cell_us"][key] *= ratios[kind]
    how = ", ".join(f"{kind} x {ratio:.3f}" for kind, ratio in ratios.items())
    options = f" with {compare['new_args']!r} for the new" if compare.get("new_args") else ""
    out["what"] = (f"{data['what']}; its host time per cell call scaled per kind ({how}) by the new / old ratio "
                   f"that benchmarks/compare_host_cost.py measured on a CPU at K = {k}, chunk length "
                   f"{compare.get('chunk_length', 0)}, {compare['old']} against this checkout{options} "
                   f"({comparison}); made from {source} by benchmarks/scale_cost_file.py: predicted, not measured "
                   "on a GPU")
    out["scaled"] = {"from": source, "comparison": comparison, "k": k, "ratios": ratios,
                     "new_args": compare.get("new_args", "")}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cost_file", help="a cost file (benchmarks/gpu_check.py --phases calibrate)")
    parser.add_argument("comparison", help="benchmarks/compare_host_cost.py --json output")
    parser.add_argument("out", help="the scaled cost file to write")
    parser.add_argument("--k", type=int, default=1, help="the workers whose ratio is taken (default 1: one host "
                        "thread, as a host per device has)")
    args = parser.parse_args(argv)
    data = cost_file.load(args.cost_file)
    compare = json.load(open(args.comparison))
    if str(args.k) not in compare.get("groups", {}):
        parser.error(f"{args.comparison}: no K = {args.k} (it has {', '.join(compare.get('groups', {})) or 'none'})")
    with open(args.out, "w") as file:
        json.dump(scaled(data, compare, args.k, args.cost_file, args.comparison), file, indent=2)
        file.write("\n")
    cost_file.load(args.out)  # a cost file the planner reads
    print(f"{args.out}: " + ", ".join(f"{kind} x {compare['groups'][str(args.k)]['ratio'][kind]:.3f}"
                                      for kind in KINDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
