"""A measuring script's child that starts children of its own (a recipe's
``bash`` and its fairseq-train, a translator, a phase of the GPU check),
ended with everything it started however the script ends.

Linux's parent-death signal reaches a child, never a grandchild, so the
command runs under a keeper: a small Python process that leads a process
group of its own, starts the command in it, and kills the whole group when
it gets SIGTERM, which its parent-death signal sends it when the script
dies (kill -9 included).  The script's side (:func:`group_of_its_own`)
kills the group when it is done with the child, on an error or Ctrl-C
too, and turns a SIGTERM of its own into an exit while the child runs, so
that it gets there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator, List, Optional

# argv: the script's pid, then the command; exits with the command's status
KEEPER = """
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the script died before the signal was set
    os._exit(1)
def end(*_):
    os.killpg(0, signal.SIGKILL)  # the keeper's group: the command, what it started, the keeper
signal.signal(signal.SIGTERM, end)
signal.signal(signal.SIGINT, end)
sys.exit(subprocess.Popen(sys.argv[2:]).wait())
"""


def end_group(pgid: int) -> None:
    """Kill every process left in group ``pgid``; nothing where none is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextmanager
def group_of_its_own(command: List[str], **popen) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(command, **popen)`` under a keeper that leads a
    process group of its own; the group is killed when the block ends,
    however it ends.  The process is the keeper: its status is the
    command's."""
    previous: Optional[object] = None
    try:
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    except ValueError:  # not the main thread: the caller sees to SIGTERM
        pass
    try:
        process = subprocess.Popen([sys.executable, "-I", "-S", "-c", KEEPER, str(os.getpid()), *command],
                                   start_new_session=True, **popen)
        try:
            yield process
        finally:
            end_group(process.pid)
            process.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_in_group(command: List[str], input=None, timeout: Optional[float] = None,
                 **popen) -> subprocess.CompletedProcess:
    """``subprocess.run`` of ``command`` in a group of its own
    (:func:`group_of_its_own`)."""
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    with group_of_its_own(command, **popen) as process:
        out, err = process.communicate(input, timeout=timeout)
        return subprocess.CompletedProcess(command, process.returncode, out, err)
