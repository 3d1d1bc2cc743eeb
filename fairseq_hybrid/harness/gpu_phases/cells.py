"""The GPU check's cells phase: one LSTM cell and one attention-softmax cell as
they run, at the paper's size (docs/gpu.md)."""

import json
import os
import subprocess
import sys

from .base import REPO


def phase_cells(args, result):
    """One LSTM cell and one attention-softmax cell as they run, at the
    paper's size (``benchmarks/cell_trace.py``)."""
    path = os.path.join(args.work, "cell_trace.json")
    subprocess.check_call([sys.executable, os.path.join(REPO, "benchmarks", "cell_trace.py"), "--device",
                           args.device, "--json", path])
    result.update(trace=json.load(open(path))["trace"]["cells"], report=path, ok=True)
