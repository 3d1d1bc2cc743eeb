#!/usr/bin/env python3
"""One prepared check of the hybrid group on the GPU(s) at hand, in phases
(exactness, precision, calibrate, cells, workers, streams; docs/gpu.md),
each run as ``gpu_phases.py NAME`` in a process group of its own under a
hard limit, so nothing of one runs on into the next one's timings.  The
budget counts from this process's start, the torch import included: a
lent machine's minutes are few.  One JSON file and one Markdown table
(``--out``) say what passed.

  python benchmarks/gpu_check.py                       # everything, in at most 8 minutes (BUDGET, LIMITS)
  python benchmarks/gpu_check.py --device cpu --phases precision,workers --steps 2   # a smoke run without a GPU
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from fairseq_hybrid.harness.child_groups import group_of_its_own

LOADED = time.time()

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PHASE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_phases.py")
COST_FILE = "cost_file.json"  # what the calibrate phase writes (fairseq_hybrid.harness.gpu_phases.base.COST_FILE), kept in --out
PHASES = ("exactness", "precision", "calibrate", "cells", "workers", "streams")
# seconds per phase; with the start of each child they fit BUDGET, the 8 minutes a lent GPU machine gives
LIMITS = {"exactness": 60, "precision": 115, "calibrate": 115, "cells": 45, "workers": 90, "streams": 55}
BUDGET = 480
# phases that check the driver itself, never run unless named: "hang" starts a grandchild and hangs
TEST_LIMITS = {"hang": 4}


def process_started():
    """When this process started (Linux: from /proc), so that the budget
    counts the interpreter's start and the torch import; elsewhere the time
    this module was loaded."""
    try:
        with open("/proc/self/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()  # after the command's name: field 3 on
        with open("/proc/uptime") as file:
            uptime = float(file.read().split()[0])
        return time.time() - (uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return LOADED


def run_phase(name, args, limit):
    """``name`` in a child process, leader of a process group of its own,
    under a hard limit of ``limit`` seconds; its result dict (partial where
    it ran out).  The group is ended when the child is done, however it
    ended: nothing it started outlives the phase."""
    out = os.path.join(args.work, f"{name}.json")
    log_path = os.path.join(args.work, f"{name}.log")
    if os.path.exists(out):
        os.remove(out)
    command = [sys.executable, PHASE_SCRIPT, name, "--device", args.device,
               "--work", args.work, "--steps", str(args.steps), "--batch", str(args.batch), "--groups", args.groups,
               "--updates", str(args.updates), "--precisions", args.precisions, "--limit", str(limit)]
    start = time.time()
    with open(log_path, "w") as log, group_of_its_own(command, stdout=log, stderr=subprocess.STDOUT) as child:
        try:
            code = child.wait(timeout=limit + 10)
        except subprocess.TimeoutExpired:
            code = "killed"  # the group is ended as the block ends
    result = json.load(open(out)) if os.path.exists(out) else {"ok": False}
    if code != 0:
        result["ok"] = False
    result.update(seconds=round(time.time() - start, 1), exit=code, log=log_path)
    if code != 0 and (not os.path.exists(out) or result.get("timed_out")):
        result["error"] = open(log_path, errors="replace").read()[-3000:]
    return result


def markdown(report):
    lines = [f"# GPU check ({report['device']}, {report['gpus']} GPU(s), torch {report['torch']}; "
             f"{report.get('seconds', '?')} s of a {report.get('budget', BUDGET):.0f} s budget)", "",
             "| phase | ok | seconds | what |", "| --- | --- | ---: | --- |"]
    for name, result in report["phases"].items():
        what = ""
        if name == "exactness" and "counts" in result:
            what = f"{result['counts']}; CUDA tests: {len(result.get('cuda_tests', []))}"
        elif name == "precision" and "runs" in result:
            parts = []
            for precision, sides in result["runs"].items():
                if "skipped" in sides:
                    parts.append(f"{precision}: skipped ({sides['skipped']})")
                    continue
                states = [f"{side} {'ok' if e.get('ok') and e.get('finite') else 'FAILED'} (last losses "
                          f"{', '.join(f'{x:.3f}' for x in e.get('losses', []))})"
                          for side, e in sides.items() if isinstance(e, dict)]
                if "largest relative parameter difference" in sides:
                    states.append(f"group vs one device: {sides['largest relative parameter difference']:.1e}")
                parts.append(f"{precision}: " + ", ".join(states))
            what = "; ".join(parts)
        elif name == "calibrate" and "chunk_sweep" in result:
            sweep = result["chunk_sweep"]
            what = (f"{result['shape']}: one device {result['one_device_tokens_per_s']:,.0f} tokens/s; "
                    f"{sweep['devices']} by chunk length: " +
                    ", ".join(f"{k} {v['vs_one_device']:.2f}x" for k, v in sweep["rows"].items()))
        elif name == "cells" and "trace" in result:
            cells = [f"{cell} {trace['host_us']:.0f} us, {trace['kernels_launched']} kernels, "
                     f"{len(trace['host_waits'])} waits, {trace['copies_total']} copies"
                     for cell, trace in result["trace"].items() if trace]
            what = "; ".join(cells)
        elif name == "streams":
            waited = [run["devices"] for run in result.get("no_waits", []) if not run["ok"]]
            what = result.get("skipped") or (f"{result.get('races', '?')} race(s) reported over "
                                             f"{len(result.get('runs', []))} runs; a step that waited for a GPU: "
                                             f"{', '.join(waited) or 'none'} of "
                                             f"{len(result.get('no_waits', []))} under sync debug mode")
        lines.append(f"| {name} | {'yes' if result.get('ok') else 'NO'} | {result.get('seconds')} | {what} |")
    workers = report["phases"].get("workers", {})
    if workers.get("rows"):
        lines += ["", f"Who queues the cells ({workers['shape']}):", "",
                  "| devices | workers | target tokens/s | step ms | host us per cell call, by device | hosts at once |",
                  "| --- | --- | ---: | ---: | --- | ---: |"]
        lines += [f"| {r['devices']} | {r['workers']} | {r['target_tokens_per_s']:,.0f} | {r['step_ms']:.1f} | "
                  f"{', '.join(f'{us:,.0f}' for us in r['host_us_per_call'])} | {r['hosts_at_once']:.2f} |"
                  for r in workers["rows"]]
    calibrate = report["phases"].get("calibrate", {})
    if calibrate.get("cost_file"):
        lines += ["", f"Cost file: `{COST_FILE}` (`fairseq-hybrid-plan --cost-file`, `fair_race_global.py --cost-file`)."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when present")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--out", default=os.path.join(REPO, "work", "gpu_check"))
    parser.add_argument("--work", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--groups", default="2,4", help="group sizes K for the streams phase")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--updates", type=int, default=4, help="fairseq-train updates per precision run")
    parser.add_argument("--precisions", default="fp32,amp,fp16",
                        help="the precision phase's runs (default fp32,amp,fp16; bf16 is reported skipped: in "
                        "fairseq 0.12 it means a TPU)")
    parser.add_argument("--budget", type=float, default=BUDGET,
                        help="seconds of wall time for the whole check (default 480): a phase runs under the "
                        "smaller of its limit and what is left, and is skipped with under 30 s left")
    args = parser.parse_args()
    started = process_started()
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES and p not in TEST_LIMITS]
    if unknown:
        parser.error(f"unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    args.work = args.work or tempfile.mkdtemp(prefix="gpu_check_")
    os.makedirs(args.work, exist_ok=True)
    report = {"device": args.device, "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
              "torch": torch.__version__, "budget": args.budget, "phases": {}}
    if torch.cuda.is_available():
        report["gpu_name"] = torch.cuda.get_device_name(0)
    for name in phases:
        left = args.budget - (time.time() - started) - 10  # the child's hard exit takes up to 10 s more
        if left < 30:
            report["phases"][name] = {"ok": False, "skipped": f"out of time ({args.budget:.0f} s budget)"}
            print(f"[gpu_check] {name}: skipped, out of time", flush=True)
            continue
        limit = min({**LIMITS, **TEST_LIMITS}[name], left)
        print(f"[gpu_check] {name} (limit {limit:.0f} s) ...", flush=True)
        report["phases"][name] = run_phase(name, args, limit)
        print(f"[gpu_check] {name}: {'ok' if report['phases'][name].get('ok') else 'FAILED'} "
              f"in {report['phases'][name]['seconds']} s", flush=True)
    report["seconds"] = round(time.time() - started, 1)
    os.makedirs(args.out, exist_ok=True)
    measured, kept = os.path.join(args.work, COST_FILE), os.path.join(args.out, COST_FILE)
    if os.path.exists(measured) and not (os.path.exists(kept) and os.path.samefile(measured, kept)):
        shutil.copy(measured, kept)
    json.dump(report, open(os.path.join(args.out, "gpu_check.json"), "w"), indent=2)
    table = markdown(report)
    open(os.path.join(args.out, "gpu_check.md"), "w").write(table)
    print(table)
    return 0 if all(result.get("ok") for result in report["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
