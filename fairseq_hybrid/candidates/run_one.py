"""One run of ``fairseq-hybrid-plan``, in a process of its own (the
benchmark suite's way: a fresh process per run, so one run's threads,
allocator and caches do not carry into the next)::

    python -m fairseq_hybrid.candidates.run_one '{"kind": "group", ...}'

prints ``RESULT {...}``.  A way to train (:data:`.ways.WAYS`: ``one``,
``ddp``, ``group``, ``groups``; its spec is :meth:`.ways.Candidate.spec`)
gives the seconds and the padded tokens (sentences times source plus
target width, as the plan counts them) of its timed steps: every way
trains the model of the user's fairseq-train command on the same
batches, the first ``batches`` that fairseq's sampler draws for that
command (seed 1), after ``warmup`` untimed steps on the first of them,
with Adam; DDP's ranks and groups under DDP each train their share of
every batch's sentences, so that the global batch stays the user's.  A
calibration (:data:`fairseq_hybrid.timing.calibration_runs.CALIBRATIONS`:
``calibrate`` for CPU devices, ``gpu_calibrate``) gives what it measured.
The run ends with the process that started it (``parent``), however that
one ends (a plan stopped by SIGTERM or kill -9 leaves no run behind).
"""

from __future__ import annotations

import json
import sys

from ..timing.calibration_runs import CALIBRATIONS
from .ways import WAYS

__all__ = ["RUNS", "main"]

RUNS = {**{kind: way.run for kind, way in WAYS.items()}, **CALIBRATIONS}


def main(argv=None) -> int:
    import logging

    logging.disable(logging.WARNING)
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    if "parent" in spec:
        from ..parallel import watch_parent

        watch_parent(spec["parent"])
    print("RESULT " + json.dumps(RUNS[spec["kind"]](spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
