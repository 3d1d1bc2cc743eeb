#!/usr/bin/env python3
"""The GPU check's phases, one a process: ``benchmarks/gpu_check.py`` runs
each as ``gpu_phases.py NAME`` in a process group of its own under a hard
limit (``--limit``), which this process also keeps itself: at the limit
every thread's stack is dumped, the result kept (written on every change)
and the whole group ended.  Each phase is a study of its own,
``fairseq_hybrid/harness/gpu_phases/NAME.py`` (what they share:
``base.py`` there); what each runs: docs/gpu.md.
"""

import argparse
import importlib
import os
import sys

from fairseq_hybrid.harness.gpu_phases.base import PhaseResult, watch_limit


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase")
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--limit", type=float, required=True, help="seconds")
    parser.add_argument("--groups", default="2,4")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--precisions", default="fp32,amp,fp16")
    args = parser.parse_args(argv)
    result = PhaseResult(os.path.join(args.work, f"{args.phase}.json"))
    watch_limit(result, args.limit)  # the hard limit: stacks dumped, result kept, process group ended
    try:
        phase = importlib.import_module(f"fairseq_hybrid.harness.gpu_phases.{args.phase}")
        getattr(phase, f"phase_{args.phase}")(args, result)
    finally:
        result.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
