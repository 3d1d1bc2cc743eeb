"""The GPU check's exactness phase: the exactness tests (a group's step against
one device's, every mode, threads and processes) run on the device (docs/gpu.md)."""

import os
import re
import subprocess
import sys

from .base import REPO


def phase_exactness(args, result):
    tests = [os.path.join(REPO, "tests", name)
             for name in ("test_hybrid_exactness.py", "test_hybrid_cells.py", "test_cell_graph.py",
                          "test_single_device_masks.py", "test_worker.py")]
    tests.append(os.path.join(REPO, "tests", "test_stage_processes.py") + "::test_cuda_processes_equal_one_device")
    report = os.path.join(args.work, "exactness.xml")
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                            *tests], cwd=REPO)
    text = open(report).read() if os.path.exists(report) else ""
    counts = {key: int(value) for key, value in re.findall(r'(tests|failures|errors|skipped)="(\d+)"', text)[:4]}
    cuda_cases = re.findall(r'<testcase [^>]*name="([^"]*cuda[^"]*)"', text)
    result.update(ok=code == 0, counts=counts, cuda_tests=cuda_cases)
