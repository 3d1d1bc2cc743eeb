"""Running a check's phases each in a process of its own under a hard time
limit (``benchmarks/gpu_check.py``, on a lent GPU machine whose minutes
are counted): a phase killed at its limit leaves what it had measured and
every thread's stack, and nothing it started outlives it."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List

LOADED = time.time()


def process_started() -> float:
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


class PhaseResult(dict):
    """A phase's result, written to its JSON file on every top-level change
    (and by :meth:`save`), so that a phase killed at its limit leaves what
    it had measured."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.lock = threading.Lock()

    def save(self):
        with self.lock:
            for _ in range(3):  # another thread may be changing a nested value while it is written
                try:
                    text = json.dumps(self, indent=2, default=str)
                    break
                except RuntimeError:
                    continue
            else:
                return
            with open(self.path + ".tmp", "w") as file:
                file.write(text)
            os.replace(self.path + ".tmp", self.path)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.save()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self.save()


def end_process_group(pgid):
    """Kill every process left in group ``pgid`` (a phase's child and what
    it started); nothing happens where none is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def watch_limit(result, limit):
    """In the phase's own process: at ``limit`` seconds dump every thread's
    stack, mark the result timed out (written), and kill the phase's whole
    process group, itself included.  A thread that needs the GIL, so
    ``faulthandler``'s hard exit 5 s later stands behind it (and the
    driver's kill of the group behind that)."""

    def expire():
        faulthandler.dump_traceback(all_threads=True)
        try:
            result.update(timed_out=True, ok=False)
        finally:
            sys.stderr.flush()
            end_process_group(os.getpgid(0))

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(limit + 5, exit=True)


def run_phase(name: str, command: List[str], work: str, limit: float) -> Dict:
    """Phase ``name`` run by ``command`` in a child process, leader of a
    process group of its own, under a hard limit of ``limit`` seconds; its
    result dict (``WORK/NAME.json``, partial where it ran out; the log
    beside it).  The group is ended when the child is done, however it
    ended: nothing it started outlives the phase."""
    out = os.path.join(work, f"{name}.json")
    log_path = os.path.join(work, f"{name}.log")
    if os.path.exists(out):
        os.remove(out)
    start = time.time()
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=limit + 10)
        except subprocess.TimeoutExpired:
            end_process_group(child.pid)
            child.wait()
            code = "killed"
        finally:
            end_process_group(child.pid)
    result = json.load(open(out)) if os.path.exists(out) else {"ok": False}
    if code != 0:
        result["ok"] = False
    result.update(seconds=round(time.time() - start, 1), exit=code, log=log_path)
    if code != 0 and (not os.path.exists(out) or result.get("timed_out")):
        result["error"] = open(log_path, errors="replace").read()[-3000:]
    return result


def run_child(path: str, limit: float, phase: Callable[[Dict], None]) -> None:
    """In a phase's own process: ``phase(result)`` under the hard limit,
    its result written to ``path`` however it ends."""
    result = PhaseResult(path)
    watch_limit(result, limit)  # the hard limit: stacks dumped, result kept, process group ended
    try:
        phase(result)
    finally:
        result.save()
