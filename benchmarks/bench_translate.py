#!/usr/bin/env python3
"""Lines per second of translating a file with a run, side by side:
``translate.sh`` at ``--buffer-size 64`` (its default: lines translated
in batches) and at ``--buffer-size 1`` (each line alone), and fairseq's
own ``fairseq-interactive`` at ``--buffer-size 64`` (what a user runs
without this package; given only the non-blank lines, as it cannot keep
blank lines in place).  Each is timed as a whole command, model loading
included, in alternating rounds (each under a keeper that ends the
translator with this script, harness.child_groups: some 25 ms of
Python's start, the same for every command); the table gives each one's
median and its ratio to fairseq-interactive.

    .venv/bin/python benchmarks/bench_translate.py --run work/tatoeba_ja_en/hybrid_lstm_base \\
        --input work/tatoeba_ja_en/raw/test.ja --lines 2000 --rounds 2

Writes translate.json and translate.md into --out (default: docs/bench).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List

from fairseq_hybrid.harness.child_groups import run_in_group
from fairseq_hybrid.harness.measuring import write_report
from fairseq_hybrid.timing.cpu_calibration import cpu_name

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SCRIPT = os.path.join(REPO, "recipes", "tatoeba_ja_en", "translate.sh")
BIN = os.path.dirname(sys.executable)


def shown(path: str) -> str:
    """A path inside the repository relative to it, any other as it is."""
    relative = os.path.relpath(path, REPO)
    return path if relative.startswith("..") else relative


@dataclass
class Command:
    """One system of the table.  ``line_for_line``: it takes every line,
    blank ones included, and must give exactly one line out for each;
    fairseq-interactive gets only the non-blank lines and is not counted."""

    name: str
    argv: List[str]
    line_for_line: bool


def commands(run: str, work: str, checkpoint: str, beam: int) -> List[Command]:
    translate = ["bash", SCRIPT, "--run", run, "--work-dir", work, "--checkpoint", checkpoint, "--beam", str(beam)]
    interactive = [
        os.path.join(BIN, "fairseq-interactive"), os.path.join(work, "bin"), "--user-dir",
        os.path.join(REPO, "fairseq_hybrid"), "--cpu", "--path", checkpoint, "--source-lang", "ja",
        "--target-lang", "en", "--bpe", "sentencepiece", "--sentencepiece-model",
        os.path.join(work, "spm", "spm.model"), "--beam", str(beam), "--buffer-size", "64", "--max-tokens", "8000"]
    return [
        Command("fairseq-interactive, buffer 64", interactive, line_for_line=False),
        Command("translate.sh, buffer 64", translate + ["--buffer-size", "64"], line_for_line=True),
        Command("translate.sh, buffer 1", translate + ["--buffer-size", "1"], line_for_line=True),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a run folder of the Tatoeba recipe")
    parser.add_argument("--work-dir", help="the folder with bin/ and spm/ (default: the run's parent)")
    parser.add_argument("--checkpoint", help="default: the run's best")
    parser.add_argument("--input", required=True, help="Japanese text, one sentence a line")
    parser.add_argument("--lines", type=int, default=2000, help="the first N lines of --input (default: 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default: 2)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--skip", default="", help="comma-separated systems to leave out (e.g. 'buffer 1')")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "bench"), help="default: docs/bench")
    args = parser.parse_args(argv)
    from fairseq_hybrid.translation.hub import find_checkpoint

    run = os.path.abspath(args.run)
    work = os.path.abspath(args.work_dir or os.path.dirname(run))
    checkpoint = os.path.abspath(args.checkpoint or find_checkpoint(run))
    with open(args.input, "rb") as f:
        lines = f.read().split(b"\n")[:args.lines]
    data = b"\n".join(lines) + b"\n"
    nonblank = b"\n".join(line for line in lines if line.strip()) + b"\n"
    systems = [command for command in commands(run, work, checkpoint, args.beam)
               if not any(skip and skip in command.name for skip in args.skip.split(","))]
    seconds = {command.name: [] for command in systems}
    for round_ in range(args.rounds):
        for command in systems:
            name = command.name
            with tempfile.TemporaryFile() as out:
                start = time.monotonic()
                # the translator the recipe's bash starts ends with this script, however it ends
                result = run_in_group(command.argv, input=data if command.line_for_line else nonblank, stdout=out,
                                      stderr=subprocess.PIPE)
                elapsed = time.monotonic() - start
                out.seek(0)
                produced = out.read()
            if result.returncode != 0:
                print(f"error: {name} failed:\n{result.stderr.decode(errors='replace')[-2000:]}", file=sys.stderr)
                return 1
            if command.line_for_line:
                count = produced.count(b"\n")
                assert count == len(lines), f"{name}: {count} lines out for {len(lines)} in"
            seconds[name].append(elapsed)
            print(f"round {round_ + 1}: {name}: {elapsed:.1f} s, {len(lines) / elapsed:.2f} lines/s", flush=True)

    base = statistics.median(seconds[systems[0].name])
    rows = []
    for name, times in seconds.items():
        median = statistics.median(times)
        rows.append({"system": name, "seconds": times, "median_seconds": median,
                     "lines_per_second": len(lines) / median, "speed_vs_fairseq_interactive": base / median})
    report = {"run": shown(run), "checkpoint": shown(checkpoint), "input": shown(os.path.abspath(args.input)),
              "lines": len(lines), "beam": args.beam, "rounds": args.rounds, "cpu": cpu_name(), "cores": os.cpu_count(), "rows": rows}
    table = ["| system | median seconds | lines/s | vs fairseq-interactive |", "| --- | ---: | ---: | ---: |"]
    table += [f"| {row['system']} | {row['median_seconds']:.1f} | {row['lines_per_second']:.2f} | "
              f"{row['speed_vs_fairseq_interactive']:.2f}x |" for row in rows]
    print("\n".join(table))
    write_report(report, os.path.join(args.out, "translate.json"),
                 f"# Translating a file: lines per second\n\n`benchmarks/bench_translate.py`: {len(lines)} lines of "
                 f"`{report['input']}`, beam {args.beam}, {args.rounds} alternating rounds, whole commands "
                 f"(model loading included), on {report['cpu']} ({report['cores']} cores), "
                 f"checkpoint `{report['checkpoint']}`.\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
