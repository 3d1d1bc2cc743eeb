"""A phase that never ends, for the GPU check driver's own test."""

import subprocess
import sys


def phase_hang(args, result):
    """A phase that never ends, for the driver's test: a grandchild that
    would sleep ten minutes, a value recorded, then a wait for it."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    result.update(grandchild=sleeper.pid, before_the_hang=True)
    sleeper.wait()
