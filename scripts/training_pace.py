#!/usr/bin/env python3
"""Pass fairseq-train's output through unchanged and say, now and then, how
fast training goes on this machine and when it will end.

    fairseq-train ... 2>&1 | python scripts/training_pace.py --max-update 4000

A CPU run's length depends on the CPU (machines of one size differ by
about 3x), so a fixed figure in a README cannot tell a user when their
run ends; the run itself can.  The pace is measured here, by wall clock,
from the first ``num_updates=`` that fairseq reports (so set-up and a
resumed run's earlier updates do not count) and includes validation and
checkpoint saving.  A line

    [pace] 0.95 s per update here; training ends in about 52 minutes (at 16:40)

comes at update ``--first`` (or at the next report of a resumed run) and
then every ``--every`` updates.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import time

UPDATES = re.compile(r"num_updates[=:]\s*(\d+)")


def pace_line(seconds_per_update: float, remaining_updates: int, now: datetime.datetime) -> str:
    remaining = seconds_per_update * max(remaining_updates, 0)
    end = now + datetime.timedelta(seconds=remaining)
    return (f"[pace] {seconds_per_update:.2f} s per update here; training ends in about "
            f"{remaining / 60:.0f} minutes (at {end:%H:%M})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-update", type=int, required=True, help="the run's --max-update")
    parser.add_argument("--first", type=int, default=100, help="the update of the first estimate (default: 100)")
    parser.add_argument("--every", type=int, default=500, help="updates between estimates (default: 500)")
    args = parser.parse_args(argv)

    start = None  # (monotonic seconds, updates) at the first report
    next_report = None
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        match = UPDATES.search(line)
        if not match:
            continue
        updates, now = int(match.group(1)), time.monotonic()
        if start is None:
            start = (now, updates)
            # the first estimate at update --first (timed from here), or at the
            # next report for a run that resumed past it
            next_report = max(args.first, updates + 1)
            continue
        if updates >= next_report and updates > start[1] and updates < args.max_update:
            per_update = (now - start[0]) / (updates - start[1])
            print(pace_line(per_update, args.max_update - updates, datetime.datetime.now()), flush=True)
            next_report = updates + args.every
    return 0


if __name__ == "__main__":
    sys.exit(main())
